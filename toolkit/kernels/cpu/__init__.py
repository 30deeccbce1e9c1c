"""numpy kernels for the CPU; importing this package registers them."""
from .. import control as _control
from . import collective, conv, elementwise, fused, fused_reduce, layout, linalg, misc, nhwc, p2p, pool, quant, reduce  # noqa: F401  (registration)

_control.register("cpu")
