"""A declarative deep-learning toolkit: Caffe-style YAML nets compiled to optimised dataflow graphs."""
from .version import __version__

__all__ = ["Net", "load", "train", "quantize", "Model", "UserError", "__version__"]


def __getattr__(name: str):
    # lazy: `import toolkit` (and every CLI start) stays free of numpy and the compiler
    if name in ("Net", "load", "train", "quantize", "Model"):
        from . import api
        return getattr(api, name)
    if name == "UserError":
        from .errors import UserError
        return UserError
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the API is loaded on first use (above), so dir() names it rather than what is loaded so far
    return sorted(set(__all__) | {k for k in globals() if not k.startswith("_") or k.startswith("__")})
