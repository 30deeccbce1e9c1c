"""A declarative deep-learning toolkit: Caffe-style YAML nets compiled to optimised dataflow graphs."""
__version__ = "0.1.0"

__all__ = ["Net", "load", "train", "Model", "UserError", "__version__"]


def __getattr__(name: str):
    # lazy: `import toolkit` (and every CLI start) stays free of numpy and the compiler
    if name in ("Net", "load", "Model"):
        from . import api
        return getattr(api, name)
    if name == "UserError":
        from .errors import UserError
        return UserError
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the API is loaded on first use (above), so dir() names it rather than what is loaded so far
    return sorted(set(__all__) | {k for k in globals() if not k.startswith("_") or k.startswith("__")})


# ``toolkit.train(net, ...)`` is the Python API's training call, but ``toolkit.train`` is also the
# training package, which the import system sets as this package's attribute whenever one of its
# modules is imported. So the package itself is made callable: calling it calls api.train.
import types as _types  # noqa: E402

from . import train as _train_package  # noqa: E402  (its __init__ imports nothing)


class _CallableTrainPackage(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .api import train
        return train(*args, **kwargs)


_train_package.__class__ = _CallableTrainPackage

