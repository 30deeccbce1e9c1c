"""CPU kernels for every elementwise op: the op's own numpy expression, writing into ``out``."""
from __future__ import annotations

from ...backend.registry import register_kernel
from ...ops.base import get_op
from ...ops.elementwise import ELEMENTWISE_IMPL


def _make(name):
    impl = ELEMENTWISE_IMPL[name]
    random = not get_op(name).pure               # an impure elementwise op draws from the executor's rng

    def factory(ctx):
        attrs = ctx.attrs
        if random:
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
    register_kernel(_name, "cpu", inplace=get_op(_name).in_place)(_make(_name))
