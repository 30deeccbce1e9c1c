"""Generated native CPU kernels: loop programs (toolkit.codegen) compiled by the system C compiler.

Each module registers builders with ``register_native``; a plan tries them before the numpy
kernel of the same op and keeps the numpy kernel where a builder declines (a dtype, an attribute
it does not handle) or where no compiler is present.
"""
from . import blocked, concat, conv, elementwise, epilogue, pool, quant, quant_between, reduce, softmax  # noqa: F401
