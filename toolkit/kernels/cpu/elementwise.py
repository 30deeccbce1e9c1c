"""CPU kernels for every elementwise op: the op's own numpy expression, writing into ``out``."""
from __future__ import annotations

from ...ops.elementwise import ELEMENTWISE_IMPL
from ...backend.registry import register_kernel

# Expressions that read an input after writing part of ``out`` cannot run with ``out`` aliasing
# an input; every other elementwise kernel may update its input in place.
NOT_IN_PLACE = {"leaky_relu", "elu", "softplus", "gelu", "sigmoid_cross_entropy", "dropout_mask",
                 "cast", "scalar", "constant"}
_NEEDS_RNG = {"dropout_mask"}


def _make(name):
    impl = ELEMENTWISE_IMPL[name]

    def factory(ctx):
        attrs = ctx.attrs
        if name in _NEEDS_RNG:
            runtime = ctx.runtime

            def run_random(ins, outs):
                impl(*ins, out=outs[0], rng=runtime.rng, **attrs)
            return run_random
        if attrs:
            def run_attrs(ins, outs):
                impl(*ins, out=outs[0], **attrs)
            return run_attrs
        if len(ctx.in_shapes) == 1:
            def run_unary(ins, outs):
                impl(ins[0], out=outs[0])
            return run_unary

        if len(ctx.in_shapes) == 2:
            def run_binary(ins, outs):
                impl(ins[0], ins[1], out=outs[0])
            return run_binary

        def run_any(ins, outs):
            impl(*ins, out=outs[0])
        return run_any
    return factory


for _name in ELEMENTWISE_IMPL:
    register_kernel(_name, "cpu", inplace=_name not in NOT_IN_PLACE)(_make(_name))
