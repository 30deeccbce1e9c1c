"""The KServe v2 HTTP routes as a Starlette application.

    GET  /v2/health/live, /v2/health/ready          200 when live / ready
    GET  /v2                                        server metadata
    GET  /v2/models/NAME[/versions/1]               model metadata (shapes with -1 for symbolic)
    GET  /v2/models/NAME[/versions/1]/ready         200 when the model is ready
    POST /v2/models/NAME[/versions/1]/infer         inference, JSON or binary tensors
    GET  /v2/models/NAME[/versions/1]/config        Triton's model configuration (get_model_config)
    GET  /v2/models[/NAME[/versions/1]]/stats       Triton's statistics (get_inference_statistics)
    GET  /metrics                                   Prometheus text

An image input ([N, 1 or 3, H, W]) also takes a BYTES tensor of shape [N] whose elements are
encoded image files (Triton's binary tensor extension): decoded here, in a thread, by the
``decode_images`` the server is given (the net's input transform's image steps), then batched
as pixels. An output asked for with the classification parameter is answered with its top
classes as strings (protocol.classify), named by the server's ``labels`` where they fit it.

Errors answer ``{"error": MESSAGE}``: 400 for a malformed request, an image that does not decode,
or a tensor of the wrong name, dtype or shape, 404 for an unknown model or version, 408 for a body
that did not arrive in time, 413 for a body over the limit, 503 when the queue is full or the
server is stopping.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter

import numpy as np
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import UserError
from ..version import __version__
from .batcher import DynamicBatcher, QueueFull
from .metrics import ServerMetrics
from .offload import INLINE_JSON_BYTES, INLINE_JSON_VALUES, Offload, WorkerDied
from .protocol import (
    BYTES,
    HEADER_LENGTH,
    BadRequest,
    classify,
    datatype_of,
    decode_request,
    encode_response,
    json_value_count,
)

EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "statistics"]
# KServe datatype -> Triton's config type name (TYPE_ + this), where the two differ
TRITON_TYPES = {"BYTES": "STRING"}


class TooLarge(Exception):
    pass


class TooSlow(Exception):
    pass


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _per_example(info, batched: bool) -> int | None:
    """The values per example of an output (all of them without a batch axis); None if symbolic."""
    dims = info.shape[1:] if batched and info.shape else info.shape
    return None if any(d is None for d in dims) else int(np.prod(dims, dtype=np.int64))


def _shape_for_metadata(info) -> list[int]:
    return [-1 if d is None else d for d in info.shape]


def _json_bytes(body: bytes, header_length: str | None) -> int:
    """The size of the body's JSON part (all of it, or the header before binary tensors)."""
    if header_length is None:
        return len(body)
    try:
        return min(int(header_length), len(body))
    except ValueError:
        return 0                              # decode_request refuses it before parsing anything


def _outcome(status: int) -> str:
    """How the shutdown line counts an infer request answered with this status."""
    if status == 200:
        return "answered"
    if status == 499:
        return "abandoned"                    # the client went away first
    return "failed" if status >= 500 and status != 503 else "refused"


class InferenceServer:
    """The state behind the routes: the model, its batcher and the figures."""

    def __init__(self, model, max_delay_ms: float, max_queue: int, max_body_bytes: int, timeout_s: float,
                 offload_workers: int, labels: list[str] | None = None, decode_images=None):
        self.model = model
        # class names, by the outputs whose values per example they fit one to one
        self.labels = {t.name: labels for t in model.outputs
                       if labels is not None and _per_example(t, model.session.batch_symbol is not None) == len(labels)}
        # (input name, [encoded image, ...]) -> [N, C, H, W] pixels, for the image inputs; None: none taken
        self.decode_images = decode_images
        self.image_inputs = {t.name for t in model.inputs if len(t.shape) == 4 and t.shape[1] in (1, 3)
                             and t.dtype.startswith(("float", "bfloat"))} if decode_images else set()
        self.name = model.name
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s
        self.offload = Offload(offload_workers)
        # infer requests by outcome, and the connection events server.py counts, for the shutdown line
        self.tally: Counter[str] = Counter()
        self.metrics = ServerMetrics(model.buckets)
        self.metrics.plans_built.set_function(lambda: model.session.plans_built)
        self.inputs = {t.name: t for t in model.inputs}
        self.outputs = {t.name: t for t in model.outputs}
        self.ready = False
        # requests are stacked along the batch axis only where the net has one
        self.batched = model.session.batch_symbol is not None
        max_rows = model.buckets[-1] if self.batched else 1
        # buckets over a sequence length: requests of different lengths batch together, padded
        prepare = model.session.pad_request if self.batched and model.session.dim_buckets else None
        self.batcher = DynamicBatcher(model.infer, max_rows, max_delay_ms / 1000.0, max_queue, self.metrics,
                                      prepare=prepare)

    # -- request checks -------------------------------------------------------------------------
    async def decoded_images(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The BYTES inputs of encoded images as pixels (decoded in a thread: PIL lets the GIL go)."""
        out = dict(arrays)
        for name, arr in arrays.items():
            if arr.dtype != object:
                continue
            if name not in self.image_inputs:
                if name in self.inputs:
                    raise BadRequest(f"input '{name}': datatype {BYTES}, the model takes "
                                     f"{datatype_of(self.inputs[name].dtype)} (encoded images are taken only by "
                                     "image inputs, [N, 1 or 3, H, W])")
                continue                      # an unknown name: check_inputs names it
            if arr.ndim != 1 or (not self.batched and arr.shape[0] != 1):
                raise BadRequest(f"input '{name}': encoded images come as BYTES of shape [N] (one image each), "
                                 f"not {list(arr.shape)}")
            if not arr.size:
                raise BadRequest(f"input '{name}': no images")
            # each image decodes to the input's C x H x W floats, however few bytes it was sent as
            if arr.shape[0] > self.batcher.max_rows:
                raise BadRequest(f"input '{name}': {arr.shape[0]} images, at most {self.batcher.max_rows} (the "
                                 "largest bucket) are decoded per request")
            try:
                out[name] = await asyncio.to_thread(self.decode_images, name, list(arr))
            except UserError as e:
                raise BadRequest(str(e).removeprefix("error: ").splitlines()[0]) from None
        return out

    def check_inputs(self, arrays: dict[str, np.ndarray]) -> int:
        """The rows of the request (its batch), after checking names, datatypes and shapes."""
        for name in arrays:
            if name not in self.inputs:
                raise BadRequest(f"model '{self.name}' has no input '{name}' (its inputs: {', '.join(self.inputs)})")
        missing = [n for n in self.inputs if n not in arrays]
        if missing:
            raise BadRequest(f"input(s) {', '.join(map(repr, missing))} missing")
        rows = set()
        for name, arr in arrays.items():
            info = self.inputs[name]
            want = datatype_of(info.dtype)
            got = datatype_of(arr.dtype)
            if got != want:
                raise BadRequest(f"input '{name}': datatype {got}, the model takes {want}")
            if (len(arr.shape) != len(info.shape)
                    or any(d is not None and d != g for d, g in zip(info.shape, arr.shape))):
                raise BadRequest(f"input '{name}': shape {list(arr.shape)}, "
                                 f"the model takes {_shape_for_metadata(info)}")
            if arr.shape:
                rows.add(arr.shape[0])
        if self.batched and len(rows) > 1:
            raise BadRequest(f"the inputs disagree on the batch size: {sorted(rows)}")
        return rows.pop() if rows else 1

    async def read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise TooLarge(f"the request body of {int(declared)} bytes is over the limit of {self.max_body_bytes}")
        encoding = request.headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", ""):
            raise BadRequest(f"Content-Encoding {encoding} is not supported; send the body uncompressed")
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.timeout_s):     # from the headers' arrival: a body that dawdles
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise TooLarge(f"the request body is over the limit of {self.max_body_bytes} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            raise TooSlow(f"the request body did not arrive within {self.timeout_s:g} s ({size} bytes came)") from None
        return b"".join(chunks)

    async def decode(self, body: bytes, header_length: str | None):
        if _json_bytes(body, header_length) <= INLINE_JSON_BYTES:
            return decode_request(body, header_length)
        return await self.offload.run(decode_request, body, header_length)

    async def encode(self, req, outputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        if json_value_count(req, outputs) <= INLINE_JSON_VALUES:
            return encode_response(self.name, req, outputs)
        # the inputs stay here: the worker needs only what says how to write the outputs
        return await self.offload.run(encode_response, self.name, dataclasses.replace(req, inputs={}), outputs)

    # -- routes ---------------------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready_route(self, request: Request) -> Response:
        return Response(status_code=200 if self.ready else 503)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse({"name": "toolkit", "version": __version__, "extensions": EXTENSIONS})

    def _check_model(self, request: Request) -> Response | None:
        name = request.path_params["model"]
        version = request.path_params.get("version")
        if name != self.name:
            return _error(404, f"unknown model '{name}' (this server serves '{self.name}')")
        if version not in (None, "1"):
            return _error(404, f"model '{name}' has no version '{version}' (it has version 1)")
        return None

    async def model_metadata(self, request: Request) -> Response:
        if (bad := self._check_model(request)) is not None:
            return bad

        def tensors(infos):
            return [{"name": t.name, "datatype": datatype_of(t.dtype), "shape": _shape_for_metadata(t)} for t in infos]
        return JSONResponse({"name": self.name, "versions": ["1"], "platform": "toolkit",
                             "inputs": tensors(self.model.inputs), "outputs": tensors(self.model.outputs)})

    async def model_config(self, request: Request) -> Response:
        """Triton's model configuration (``get_model_config``): the tensors without the batch
        axis and ``max_batch_size`` the largest bucket where the net has a batch axis (Triton's
        convention), the buckets as the dynamic batcher's preferred sizes."""
        if (bad := self._check_model(request)) is not None:
            return bad

        def tensors(infos):
            out = []
            for t in infos:
                dims = _shape_for_metadata(t)
                out.append({"name": t.name, "data_type": "TYPE_" + TRITON_TYPES.get(datatype_of(t.dtype),
                                                                                     datatype_of(t.dtype)),
                            "dims": dims[1:] if self.batched and dims else dims})
            return out
        config = {"name": self.name, "platform": "toolkit", "backend": "toolkit",
                  "version_policy": {"latest": {"num_versions": 1}},
                  "max_batch_size": self.model.buckets[-1] if self.batched else 0,
                  "input": tensors(self.model.inputs), "output": tensors(self.model.outputs),
                  "instance_group": [{"name": self.name, "kind": "KIND_GPU" if self.model.device.startswith("gpu")
                                      else "KIND_CPU", "count": 1}]}
        if self.batched:
            config["dynamic_batching"] = {"preferred_batch_size": list(self.model.buckets),
                                          "max_queue_delay_microseconds": int(self.batcher.max_delay_s * 1e6)}
        return JSONResponse(config)

    async def model_stats(self, request: Request) -> Response:
        """Triton's statistics extension (``get_inference_statistics``)."""
        if "model" in request.path_params and (bad := self._check_model(request)) is not None:
            return bad
        return JSONResponse({"model_stats": [self.metrics.triton.json(self.name)]})

    async def model_ready(self, request: Request) -> Response:
        if (bad := self._check_model(request)) is not None:
            return bad
        return Response(status_code=200 if self.ready else 503)

    async def metrics_route(self, request: Request) -> Response:
        body, content_type = self.metrics.text()
        return Response(body, media_type=content_type)

    async def infer(self, request: Request) -> Response:
        start = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            response = await self._infer(request)
            outcome = _outcome(response.status_code)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when the shutdown timeout ends; answer it here rather
            # than let uvicorn log a traceback and send a text 500
            self.metrics.errors.labels(reason="cut_off").inc()
            response = _error(503, "the server stopped before this request was answered (its shutdown timeout ran out)")
            outcome = "failed"
        finally:
            self.metrics.in_flight.dec()
        self.tally[outcome] += 1
        self.metrics.requests.labels(code=str(response.status_code)).inc()
        took = time.perf_counter() - start
        if response.status_code == 200:
            self.metrics.latency.observe(took)
        if response.status_code != 404:                  # an unknown model is no request of this one
            self.metrics.triton.request(response.status_code == 200, took)
        return response

    async def _infer(self, request: Request) -> Response:
        if (bad := self._check_model(request)) is not None:
            self.metrics.errors.labels(reason="unknown_model").inc()
            return bad
        try:
            body = await self.read_body(request)
            req = await self.decode(body, request.headers.get(HEADER_LENGTH))
            req.inputs = await self.decoded_images(req.inputs)
            rows = self.check_inputs(req.inputs)
            if req.outputs is not None:
                unknown = [n for n in req.outputs if n not in self.outputs]
                if unknown:
                    raise BadRequest(f"model '{self.name}' has no output {', '.join(map(repr, unknown))} "
                                     f"(its outputs: {', '.join(self.outputs)})")
        except TooLarge as e:
            self.metrics.errors.labels(reason="too_large").inc()
            return _error(413, str(e))
        except TooSlow as e:
            self.metrics.errors.labels(reason="timeout").inc()
            return JSONResponse({"error": str(e)}, status_code=408, headers={"connection": "close"})
        except BadRequest as e:
            self.metrics.errors.labels(reason="bad_request").inc()
            return _error(400, str(e))
        except ClientDisconnect:
            self.metrics.errors.labels(reason="client_gone").inc()
            return Response(status_code=499)
        except WorkerDied as e:
            self.metrics.errors.labels(reason="internal").inc()
            return _error(500, f"internal error: {e}")
        try:
            outputs = await self.batcher.submit(req.inputs, rows if self.batched else 1)
            if req.outputs is not None:
                outputs = {n: outputs[n] for n in req.outputs}
            for name, count in req.classification.items():
                outputs[name] = classify(outputs[name], count, self.labels.get(name), self.batched)
            body, headers = await self.encode(req, outputs)
        except QueueFull as e:
            self.metrics.errors.labels(reason="queue_full").inc()
            return _error(503, str(e))
        except UserError as e:
            self.metrics.errors.labels(reason="bad_request").inc()
            return _error(400, str(e).removeprefix("error: "))
        except Exception as e:                      # a bug, or a worker that died: answer, count it, keep serving
            self.metrics.errors.labels(reason="internal").inc()
            return _error(500, f"internal error: {type(e).__name__}: {e}")
        return Response(body, headers=headers)

    def app(self):
        @contextlib.asynccontextmanager
        async def lifespan(app):
            self.batcher.start()
            self.ready = True
            try:
                yield
            finally:
                self.ready = False
                await self.batcher.stop()
                self.offload.close()

        model = "/v2/models/{model}"
        version = model + "/versions/{version}"
        routes = [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready_route),
            Route("/v2", self.server_metadata),
            Route("/v2/models/stats", self.model_stats),        # before {model}, which would take it
            Route(model, self.model_metadata),
            Route(version, self.model_metadata),
            Route(model + "/ready", self.model_ready),
            Route(version + "/ready", self.model_ready),
            Route(model + "/config", self.model_config),
            Route(version + "/config", self.model_config),
            Route(model + "/stats", self.model_stats),
            Route(version + "/stats", self.model_stats),
            Route(model + "/infer", self.infer, methods=["POST"]),
            Route(version + "/infer", self.infer, methods=["POST"]),
            Route("/metrics", self.metrics_route),
        ]
        async def no_route(request: Request, exc) -> Response:
            # unknown paths and methods answer in the protocol's error shape too
            status = getattr(exc, "status_code", 404)
            what = "no route" if status == 404 else f"method {request.method} not allowed on"
            return _error(status, f"{what} {request.url.path}")

        routed = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: no_route, 405: no_route})

        async def app(scope, receive, send):
            """Infer requests go straight to their handler, past the router and middleware
            (a third of the server's time per request, measured under load); the rest is routed."""
            if scope["type"] == "http" and scope["method"] == "POST":
                params = _infer_path(scope["path"])
                if params is not None:
                    scope["path_params"] = params
                    response = await self.infer(Request(scope, receive))
                    await response(scope, receive, send)
                    return
            await routed(scope, receive, send)
        return app


def _infer_path(path: str) -> dict[str, str] | None:
    """{"model": ..., "version": ...} of /v2/models/NAME[/versions/V]/infer, else None."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[4] == "infer" and parts[3]:
        return {"model": parts[3]}
    if len(parts) == 7 and parts[:3] == ["", "v2", "models"] and parts[4] == "versions" and parts[6] == "infer" \
            and parts[3] and parts[5]:
        return {"model": parts[3], "version": parts[5]}
    return None
