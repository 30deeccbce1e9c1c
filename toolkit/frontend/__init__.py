"""Front end: net file -> validated NetSpec -> per-phase graphs (with FILE:LINE:COL errors).

``Net`` and ``OBJECTIVE`` are imported when first asked for, so that a reader of YAML files with
positions (the zoo's cards, ``toolkit zoo list``) does not load the layers and the compiler."""


def __getattr__(name: str):
    if name == "Net":
        from .net import Net
        return Net
    if name == "OBJECTIVE":
        from .lower import OBJECTIVE
        return OBJECTIVE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Net", "OBJECTIVE"]
