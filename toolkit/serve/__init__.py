"""`toolkit serve`: the KServe v2 / Triton HTTP inference protocol over a compiled model.

protocol.py decodes and encodes the v2 JSON and binary-tensor bodies (offload.py, the large
JSON ones, in worker processes), batcher.py coalesces requests into bucket-sized batches,
metrics.py keeps the Prometheus figures, app.py is the ASGI application (Starlette routes, run
by uvicorn), and server.py binds, enforces the connection limit and deadlines, and shuts down.
"""
