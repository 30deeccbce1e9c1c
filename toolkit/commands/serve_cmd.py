"""``toolkit serve``: the infer phase behind the KServe v2 / Triton HTTP protocol."""
from __future__ import annotations

import sys
import time

from ..api import Net, load
from ..errors import UserError
from ..training.data import recorded_input
from .classes import class_names, score_widths
from .request_images import image_decoder


def run_serve(args) -> int:
    if args.max_delay_ms < 0:
        raise UserError(f"--max-delay-ms must be 0 or more, got {args.max_delay_ms:g}")
    if not args.timeout_s > 0:
        raise UserError(f"--timeout-s must be more than 0, got {args.timeout_s:g}")
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UserError(f"toolkit serve needs {e.name}: pip install the toolkit again (it is a dependency)") from None
    from ..serve.server import bind, connection_limit, serve

    # a taken port or too low a descriptor limit is an error before the compile, not after
    max_connections = connection_limit(args.max_connections)
    bind(args.host, args.port).close()
    model = load(Net(args.net, set=args.overrides), weights=args.weights, device=args.device, dtype=args.dtype,
                 buckets=args.buckets, disable=tuple(args.disable or ()), optimize_graph=not args.no_optimize,
                 allow_missing=args.allow_missing, transform=not args.no_transform)
    if model.transform is not None:
        print(f"inputs are transformed {model.transform.heading}: {model.transform.describe()} "
              "(--no-transform serves them as given)", file=sys.stderr, flush=True)
    widths = score_widths({t.name: t.shape for t in model.outputs})
    names = class_names(args.labels, recorded_input(model.net.file), widths)
    if names is not None:
        print(f"class names: {len(names)}{' from ' + args.labels if args.labels else ' (recorded with the model)'}; "
              "the classification parameter answers with them", file=sys.stderr, flush=True)
    if args.warm:
        start = time.perf_counter()
        built = model.warm()
        print(f"warmed {built} bucket plan(s) in {time.perf_counter() - start:.2f} s", file=sys.stderr, flush=True)
    return serve(model, args.host, args.port, args.max_delay_ms, args.max_queue, int(args.max_body_mb * 2**20),
                 args.shutdown_timeout, args.timeout_s, max_connections, names, image_decoder(model))
