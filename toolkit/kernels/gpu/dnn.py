"""Convolutions through cuDNN, called through ctypes on a handle of our own, so that a CUDA graph
can capture them (runtime/capture.py) as it captures blas.py's GEMMs.

The forward convolution (``conv2d`` with its bias, also as the head of a fused epilogue), the fused
``conv2d_max_pool2d`` (cuDNN's convolution, then pooling.py's max pooling kernel) and
the input gradient (``conv2d_grad_input``) take over from the im2col kernels of arrays.py, which
stay as each one's fallback: when cuDNN cannot be loaded, when the ``cudnn`` setting is off
(``TOOLKIT_CUDNN=0``), for a dtype cuDNN does not take, or when cuDNN offers no algorithm for the
shapes. The weight gradient (``conv2d_grad_weight``) goes to cuDNN or stays on im2col + cuBLAS
per convolution, when the plan is built (dnn_routes.py's ``weight_gradient_route``): cuDNN where im2col's column
buffer would be larger than the workspace bound, else whichever of the two measures faster on the
device, the choice kept for the process so that every plan of it (captured or kernel by kernel)
computes that gradient the same way.

What is decided when the plan is built, once per convolution:
- the descriptors (NCHW, packed; an input or output the plan hands over with other strides goes
  through a packed staging buffer, so an algorithm is never asked to take strides it was not
  chosen for);
- the algorithm: cuDNN's heuristic ranking (``cudnnGet*Algorithm_v7``), the first that succeeds,
  fits the workspace and is deterministic. Heuristics rather than timed search
  (``cudnnFind*``), and deterministic algorithms only, because a timed search can choose
  differently from one run to the next and the non-deterministic weight-gradient algorithms sum
  with atomics: either would break bit-for-bit reproducible training and the check that a
  captured plan equals the same plan run kernel by kernel;
- the math: float32 follows the precision policy (dnn_routes.py's ``policy``): ``strict`` (the default) holds it
  to FMA kernels (``CUDNN_FMA_MATH``), so results equal the CPU's to float32 rounding; ``tf32``
  is PyTorch's default (``torch.backends.cudnn.allow_tf32``): cuDNN's default math, which lets
  all three directions run on TF32 tensor cores on Ampere and later (cuBLAS's GEMMs stay float32
  under both, as PyTorch's ``matmul.allow_tf32`` default). float16 may use Tensor Cores and
  accumulates in float32; so does bfloat16, which CuPy cannot hold: a float32 convolution with
  an operand rounded to bfloat16 runs on bfloat16 copies of its operands (dnn_bfloat16.py).
- the workspace: at most the ``cudnn_workspace_mb`` setting per stream; an algorithm that wants
  more is passed over.

The handle is per (device, thread), given the current stream before a call on a new stream, with
a workspace of its own per stream, allocated from the device on a plan's first, eager run (grown
there when a later plan needs more, the smaller one kept) and never freed, so a captured call
never allocates. The library is the one the NVIDIA wheels' locator finds (the
``nvidia-cudnn`` wheel PyTorch and CuPy use), else the loader's search;
the ``cudnn_library`` setting (``TOOLKIT_CUDNN_LIBRARY``) names another file.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from ...backend.devices import gpu_module
from ...backend.measured import register_measured
from ...backend.registry import KERNELS, SPECIALISED
from ...ops.conv import conv_out_size
from ...ops.fused import split_attrs
from ...settings import current, off_text
from . import blas
from .dnn_bfloat16 import BFLOAT16, IN_BFLOAT16, InBfloat16, operand_type
from .dnn_routes import CHOSEN, adopt_routes, export_routes, policy, weight_gradient_route, workspace_limit
from .pooling import fused_max_pool

# cudnnDataType_t, cudnnTensorFormat_t, cudnnConvolutionMode_t, cudnnMathType_t,
# cudnnDeterminism_t (cudnn_graph.h / cudnn_cnn.h, unchanged from cuDNN 7 to 9)
DATA_FLOAT, DATA_DOUBLE, DATA_HALF = 0, 1, 2
DATA_BFLOAT16 = 9                      # cuDNN 8.1 and later
FORMAT_NCHW, FORMAT_NHWC = 0, 1
CROSS_CORRELATION = 1
MATH_DEFAULT, MATH_TENSOR_OP, MATH_TENSOR_OP_ALLOW_CONVERSION, MATH_FMA = 0, 1, 2, 3
DETERMINISTIC = 1

# dtype -> (tensor data type, compute type, math type asked for under the strict policy, ctypes
# type of alpha and beta)
TYPES = {
    np.dtype(np.float32): (DATA_FLOAT, DATA_FLOAT, MATH_FMA, ctypes.c_float),
    np.dtype(np.float64): (DATA_DOUBLE, DATA_DOUBLE, MATH_FMA, ctypes.c_double),
    np.dtype(np.float16): (DATA_HALF, DATA_FLOAT, MATH_TENSOR_OP, ctypes.c_float),
}
# bfloat16 operands (uint16 arrays holding a bfloat16's bits: CuPy has no bfloat16), summed in
# float32 on tensor cores (dnn_bfloat16.py)
BFLOAT16_TYPES = (DATA_BFLOAT16, DATA_FLOAT, MATH_TENSOR_OP, ctypes.c_float)
# the math type float32 asks for under each policy: tf32 as PyTorch sets it with allow_tf32
# (cuDNN's default math, which may convert to TF32; FMA only when TF32 is not allowed)
FLOAT32_MATH = {"strict": MATH_FMA, "tf32": MATH_DEFAULT}
MAX_ALGORITHMS = 16


class CudnnError(RuntimeError):
    """A cuDNN call failed."""


class Unsupported(Exception):
    """cuDNN will not take this convolution; the im2col kernel runs it instead."""


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three share one layout)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("math_type", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


# direction -> (heuristic, workspace size, the call)
DIRECTIONS = {
    "forward": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnGetConvolutionForwardWorkspaceSize",
                "cudnnConvolutionForward"),
    "data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnGetConvolutionBackwardDataWorkspaceSize",
             "cudnnConvolutionBackwardData"),
    "filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7", "cudnnGetConvolutionBackwardFilterWorkspaceSize",
               "cudnnConvolutionBackwardFilter"),
}


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    pi, psz, pp = ctypes.POINTER(i), ctypes.POINTER(sz), ctypes.POINTER(p)
    signatures = {
        "cudnnCreate": [pp], "cudnnSetStream": [p, p],
        "cudnnCreateTensorDescriptor": [pp], "cudnnSetTensor4dDescriptorEx": [p, i, i, i, i, i, i, i, i, i],
        "cudnnCreateFilterDescriptor": [pp], "cudnnSetFilter4dDescriptor": [p, i, i, i, i, i, i],
        "cudnnCreateConvolutionDescriptor": [pp],
        "cudnnSetConvolution2dDescriptor": [p, i, i, i, i, i, i, i, i],
        "cudnnSetConvolutionGroupCount": [p, i], "cudnnSetConvolutionMathType": [p, i],
        # (handle, first desc, second desc, conv, last desc, requested, *returned, perf[])
        "cudnnGetConvolutionForwardAlgorithm_v7": [p, p, p, p, p, i, pi, p],
        "cudnnGetConvolutionBackwardDataAlgorithm_v7": [p, p, p, p, p, i, pi, p],
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [p, p, p, p, p, i, pi, p],
        # (handle, first desc, second desc, conv, last desc, algo, *bytes)
        "cudnnGetConvolutionForwardWorkspaceSize": [p, p, p, p, p, i, psz],
        "cudnnGetConvolutionBackwardDataWorkspaceSize": [p, p, p, p, p, i, psz],
        "cudnnGetConvolutionBackwardFilterWorkspaceSize": [p, p, p, p, p, i, psz],
        # (handle, alpha, desc, a, desc, b, conv, algo, workspace, bytes, beta, desc, out)
        "cudnnConvolutionForward": [p, p, p, p, p, p, p, i, p, sz, p, p, p],
        "cudnnConvolutionBackwardData": [p, p, p, p, p, p, p, i, p, sz, p, p, p],
        "cudnnConvolutionBackwardFilter": [p, p, p, p, p, p, p, i, p, sz, p, p, p],
        "cudnnAddTensor": [p, p, p, p, p, p, p],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.cudnnGetErrorString.argtypes, lib.cudnnGetErrorString.restype = [i], ctypes.c_char_p
    # the fused forward (conv + bias (+ z) + ReLU): optional, so that a build without it keeps the rest
    optional = {
        "cudnnCreateActivationDescriptor": [pp], "cudnnSetActivationDescriptor": [p, i, i, ctypes.c_double],
        # (handle, alpha1, x desc, x, w desc, w, conv, algo, workspace, bytes, alpha2, z desc, z,
        #  bias desc, bias, activation, y desc, y)
        "cudnnConvolutionBiasActivationForward": [p, p, p, p, p, p, p, i, p, sz, p, p, p, p, p, p, p, p],
    }
    try:
        for name, args in optional.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        lib.fused_forward = True
    except AttributeError:
        lib.fused_forward = False
    return lib


_library: list = []          # [library] once loaded, [None, reason] when it cannot be
_library_lock = threading.Lock()


def library() -> ctypes.CDLL | None:
    """The declared library, or None when it cannot be loaded (``unavailable()`` says why)."""
    with _library_lock:
        if not _library:
            try:
                _library.append(_declare(blas.load_library("cudnn", "cudnn_library", majors=(9, 8))))
            except (OSError, AttributeError, blas.CublasError) as e:
                _library.extend([None, f"cuDNN cannot be loaded ({e})"])
    return _library[0]


def unavailable() -> str | None:
    """Why convolutions do not go through cuDNN, or None when they do."""
    if not current().cudnn:
        return off_text("cudnn")
    if library() is None:
        return _library[1]
    return None


def check(status: int, call: str) -> None:
    if status != 0:
        text = library().cudnnGetErrorString(status)
        raise CudnnError(f"{call} failed: {text.decode() if text else 'cuDNN status'} ({status})")


class Handle:
    """One cuDNN handle with a workspace per stream, for one device and one thread."""

    def __init__(self):
        self.lib = library()
        raw = ctypes.c_void_p()
        check(self.lib.cudnnCreate(ctypes.byref(raw)), "cudnnCreate")
        self.raw = raw
        self.stream: int | None = None
        self.workspaces: dict[int, tuple[int, object]] = {}      # stream -> (bytes, memory)
        self.scratches: dict[int, object] = {}                    # stream -> uint16 array
        self.outgrown: list = []       # smaller workspaces a captured graph may still point at

    def on_current_stream(self, need: int = 0) -> tuple[ctypes.c_void_p, int]:
        """The raw handle, set to the current stream, and the address of that stream's workspace,
        of at least ``need`` bytes."""
        stream = blas.stream_pointer()
        if stream != self.stream:
            check(self.lib.cudnnSetStream(self.raw, ctypes.c_void_p(stream)), "cudnnSetStream")
            self.stream = stream
        size, space = self.workspaces.get(stream, (-1, None))
        if size < max(need, 1):
            if space is not None:
                self.outgrown.append(space)
            size = max(need, 1)
            cp = gpu_module()
            memory = getattr(getattr(cp.cuda, "memory", None), "Memory", None)
            space = memory(size) if memory is not None else cp.empty(size, np.uint8)
            self.workspaces[stream] = (size, space)
        return self.raw, (space.ptr if hasattr(space, "ptr") else blas.pointer(space))

    def scratch(self, elements: int):
        """The current stream's uint16 scratch (bfloat16 operands), of at least ``elements``:
        grown like the workspace, on a plan's first, eager run."""
        stream = blas.stream_pointer()
        space = self.scratches.get(stream)
        if space is None or space.size < elements:
            if space is not None:
                self.outgrown.append(space)
            space = self.scratches[stream] = gpu_module().empty(max(elements, 1), np.uint16)
        return space


_handles = threading.local()


def handle() -> Handle:
    """This thread's handle on the current device."""
    return blas.per_device(_handles, Handle)


def _descriptor(create: str, set_: str, *args) -> ctypes.c_void_p:
    lib = library()
    desc = ctypes.c_void_p()
    check(getattr(lib, create)(ctypes.byref(desc)), create)
    check(getattr(lib, set_)(desc, *args), set_)
    return desc


def tensor_descriptor(shape, data_type: int, layout: str = "nchw") -> ctypes.c_void_p:
    """A packed tensor of the NCHW ``shape``, held NCHW or, with ``layout="nhwc"``, channels last
    (cuDNN reads the layout from the strides)."""
    n, c, h, w = (int(v) for v in shape)
    strides = (c * h * w, h * w, w, 1) if layout == "nchw" else (h * w * c, 1, w * c, c)
    return _descriptor("cudnnCreateTensorDescriptor", "cudnnSetTensor4dDescriptorEx", data_type,
                       n, c, h, w, *strides)


class Convolution:
    """One convolution's descriptors, for one direction, with its algorithm chosen. The shapes
    are NCHW and OIHW whatever the ``layout``: "nhwc" holds the images channels last and the
    filter as [O, kH, kW, C/group] (cuDNN's NHWC filter format, which its Tensor Core kernels
    read without a transpose)."""

    def __init__(self, direction: str, x_shape, w_shape, y_shape, attrs, dtype, layout: str = "nchw",
                 precision: str = "strict"):
        if dtype != BFLOAT16:
            dtype = np.dtype(dtype)
            if dtype not in TYPES:
                raise Unsupported(f"cuDNN convolutions take float16, bfloat16, float32 and float64, not {dtype}")
        if min(*x_shape, *w_shape, *y_shape) == 0:
            raise Unsupported("an empty tensor")
        self.data_type, compute, self.math, scalar = BFLOAT16_TYPES if dtype == BFLOAT16 else TYPES[dtype]
        if dtype == np.float32:
            self.math = FLOAT32_MATH[precision]
        self.one, self.zero = scalar(1.0), scalar(0.0)
        (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["pad"], attrs["dilation"]
        self.x = tensor_descriptor(x_shape, self.data_type, layout)
        self.y = tensor_descriptor(y_shape, self.data_type, layout)
        self.w = _descriptor("cudnnCreateFilterDescriptor", "cudnnSetFilter4dDescriptor", self.data_type,
                             FORMAT_NCHW if layout == "nchw" else FORMAT_NHWC, *(int(v) for v in w_shape))
        self.conv = _descriptor("cudnnCreateConvolutionDescriptor", "cudnnSetConvolution2dDescriptor",
                                ph, pw, sh, sw, dh, dw, CROSS_CORRELATION, compute)
        lib = library()
        check(lib.cudnnSetConvolutionGroupCount(self.conv, int(attrs["group"])), "cudnnSetConvolutionGroupCount")
        check(lib.cudnnSetConvolutionMathType(self.conv, self.math), "cudnnSetConvolutionMathType")
        heuristic, size_call, self.call_name = DIRECTIONS[direction]
        # each direction's descriptors in the order its calls take them
        self.order = {"forward": (self.x, self.w, self.conv, self.y),
                      "data": (self.w, self.y, self.conv, self.x),
                      "filter": (self.x, self.y, self.conv, self.w)}[direction]
        self.call = getattr(lib, self.call_name)
        self.algo, self.workspace_bytes = self._choose(heuristic, size_call)

    def _choose(self, heuristic: str, size_call: str) -> tuple[int, int]:
        lib = library()
        raw, _ = handle().on_current_stream()
        perfs = (AlgoPerf * MAX_ALGORITHMS)()
        count = ctypes.c_int(0)
        check(getattr(lib, heuristic)(raw, *self.order, MAX_ALGORITHMS, ctypes.byref(count), perfs), heuristic)
        passed, limit = [], workspace_limit()
        for perf in perfs[:count.value]:
            if perf.status != 0 or perf.determinism != DETERMINISTIC:
                continue
            if self.math == MATH_FMA and perf.math_type in (MATH_TENSOR_OP, MATH_TENSOR_OP_ALLOW_CONVERSION):
                continue                       # TF32 for float32: not what the other paths compute
            if self.math != MATH_FMA:
                # each algorithm of the ranking runs with the math type cuDNN ranked it with
                check(lib.cudnnSetConvolutionMathType(self.conv, perf.math_type), "cudnnSetConvolutionMathType")
            size = ctypes.c_size_t(0)
            if getattr(lib, size_call)(raw, *self.order, perf.algo, ctypes.byref(size)) != 0:
                continue
            if size.value <= limit:
                return perf.algo, size.value
            passed.append(f"algorithm {perf.algo} wants {size.value} bytes of workspace")
        raise Unsupported("cuDNN offers no deterministic algorithm for these shapes"
                          + (f" ({'; '.join(passed)})" if passed else ""))

    def __call__(self, a, b, out, beta=None) -> None:
        """out = conv(a, b) in this direction: a and b are the call's two operands in its order."""
        raw, workspace = handle().on_current_stream(self.workspace_bytes)
        check(self.call(raw, ctypes.byref(self.one), self.order[0], ctypes.c_void_p(blas.pointer(a)),
                        self.order[1], ctypes.c_void_p(blas.pointer(b)), self.conv, self.algo,
                        ctypes.c_void_p(workspace), self.workspace_bytes,
                        ctypes.byref(self.zero if beta is None else beta), self.order[3],
                        ctypes.c_void_p(blas.pointer(out))), self.call_name)


class _Packed:
    """An operand as a packed array: itself when it already is, else a staging copy (made on the
    plan's first, eager run, so a captured run never allocates)."""

    def __init__(self):
        self.stage = None

    def read(self, array):
        if array.flags.c_contiguous:
            return array
        if self.stage is None:
            self.stage = gpu_module().empty(array.shape, array.dtype)
        gpu_module().copyto(self.stage, array)
        return self.stage

    def target(self, array):
        if array.flags.c_contiguous:
            return array
        if self.stage is None:
            self.stage = gpu_module().empty(array.shape, array.dtype)
        return self.stage


def _bias_adder(channels: int, y_shape, dtype):
    """y += b (one value per channel) by cudnnAddTensor."""
    data_type, _compute, _math, scalar = TYPES[np.dtype(dtype)]
    bias = tensor_descriptor((1, channels, 1, 1), data_type)
    out = tensor_descriptor(y_shape, data_type)
    one = scalar(1.0)

    def add(b, y):
        raw, _ = handle().on_current_stream()
        check(library().cudnnAddTensor(raw, ctypes.byref(one), bias, ctypes.c_void_p(blas.pointer(b)),
                                       ctypes.byref(one), out, ctypes.c_void_p(blas.pointer(y))), "cudnnAddTensor")
    return add


def _convolution(direction: str, x_shape, w_shape, y_shape, attrs, dtype, precision: str, operands: str):
    """call(a, b, out) for ``direction`` on packed arrays of ``dtype``: cuDNN in that type, or on
    bfloat16 copies of the operands where ``operands`` is bfloat16 (``operand_type``)."""
    if operands != BFLOAT16:
        return Convolution(direction, x_shape, w_shape, y_shape, attrs, dtype, precision=precision)
    conv = Convolution(direction, x_shape, w_shape, y_shape, attrs, BFLOAT16)
    shapes = {"forward": (x_shape, w_shape, y_shape), "data": (w_shape, y_shape, x_shape),
              "filter": (x_shape, y_shape, w_shape)}[direction]
    return InBfloat16(conv, *shapes, scratch=lambda elements: handle().scratch(elements))


def _forward(x_shape, w_shape, y_shape, attrs, dtype, has_bias: bool, precision: str = "strict",
             operands: str | None = None):
    """f(ins, y): y = conv(x, w) (+ b), y packed."""
    conv = _convolution("forward", x_shape, w_shape, y_shape, attrs, dtype, precision, operands or str(dtype))
    add_bias = _bias_adder(w_shape[0], y_shape, dtype) if has_bias else None
    x_in, w_in = _Packed(), _Packed()

    def forward(ins, y):
        conv(x_in.read(ins[0]), w_in.read(ins[1]), y)
        if add_bias is not None:
            add_bias(gpu_module().ascontiguousarray(ins[2]), y)
    return forward


def conv2d(ctx):
    operands = operand_type(ctx)
    forward = _forward(ctx.in_shapes[0], ctx.in_shapes[1], ctx.out_shapes[0], ctx.attrs, ctx.dtype,
                       len(ctx.in_shapes) == 3, policy(ctx), operands)
    y_out = _Packed()

    def run(ins, outs):
        y = y_out.target(outs[0])
        forward(ins, y)
        if y is not outs[0]:
            gpu_module().copyto(outs[0], y)
    run.operands = operands
    return run


def conv2d_max_pool2d(ctx):
    """cuDNN's convolution into a buffer of the plan's own, then the max over each pooling
    window of it (the fusion pass guarantees unpadded, floor-mode windows)."""
    cp = gpu_module()
    conv_attrs, pool = split_attrs(ctx.attrs)
    n, _c, h, w = ctx.in_shapes[0]
    o, _cg, kh, kw = ctx.in_shapes[1]
    (sh, sw), (ph, pw), (dh, dw) = conv_attrs["stride"], conv_attrs["pad"], conv_attrs["dilation"]
    conv_shape = (n, o, conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw))
    forward = _forward(ctx.in_shapes[0], ctx.in_shapes[1], conv_shape, conv_attrs, ctx.dtype,
                       len(ctx.in_shapes) == 3, policy(ctx))
    conv_out = cp.empty(conv_shape, ctx.dtype)
    out_h, out_w = ctx.out_shapes[0][2:]
    (pkh, pkw), (psh, psw) = pool["kernel"], pool["stride"]
    windows = [conv_out[:, :, i:i + psh * (out_h - 1) + 1:psh, j:j + psw * (out_w - 1) + 1:psw]
               for i in range(pkh) for j in range(pkw)]
    # pooling.py's one kernel over the windows; CuPy's maxima, one per offset, for other dtypes
    pool_kernel = fused_max_pool(conv_shape, ctx.out_shapes[0], pool, ctx.dtype)

    def run(ins, outs):
        forward(ins, conv_out)
        if pool_kernel is not None and outs[0].flags.c_contiguous:
            pool_kernel(conv_out, outs[0])
            return
        cp.copyto(outs[0], windows[0])
        for view in windows[1:]:
            cp.maximum(outs[0], view, out=outs[0])
    return run


def _gradient(conv):
    """run(ins, outs) for a gradient op whose inputs are (output gradient, the other operand):
    cuDNN takes the other operand first."""
    g_in, other_in, out = _Packed(), _Packed(), _Packed()

    def run(ins, outs):
        target = out.target(outs[0])
        conv(other_in.read(ins[1]), g_in.read(ins[0]), target)
        if target is not outs[0]:
            gpu_module().copyto(outs[0], target)
    return run


def conv2d_grad_input(ctx):
    g_shape, w_shape = ctx.in_shapes
    operands = operand_type(ctx)
    run = _gradient(_convolution("data", ctx.out_shapes[0], w_shape, g_shape, ctx.attrs, ctx.dtype,
                                 policy(ctx), operands))
    run.operands = operands
    return run


def conv2d_grad_weight(ctx):
    g_shape, x_shape = ctx.in_shapes
    operands = operand_type(ctx)
    run = _gradient(_convolution("filter", x_shape, ctx.out_shapes[0], g_shape, ctx.attrs, ctx.dtype,
                                 policy(ctx), operands))
    run.operands = operands
    return run


BUILDERS = {"conv2d": conv2d, "conv2d_max_pool2d": conv2d_max_pool2d,
            "conv2d_grad_input": conv2d_grad_input, "conv2d_grad_weight": conv2d_grad_weight}

# The ops that always go through cuDNN: forward and input-gradient convolutions measured 1.7x to
# 3.6x faster than im2col on an H100 (benchmarks/gpu_conv.py, batch 64, float32). The weight
# gradient is measured per convolution instead (dnn_routes.py): on the small ResNet's
# layers at batch 64 cuDNN's deterministic weight-gradient algorithms took 138 us where im2col
# took 91 (1x1 and 16-channel 3x3 layers 1.5x to 4.2x slower), but im2col's column buffer grows
# with the batch and the image (gigabytes for ResNet-50's first layers at batch 256).
CUDNN_OPS = {"conv2d", "conv2d_max_pool2d", "conv2d_grad_input"}


def _choosing(op: str, builder, fallback):
    def factory(ctx):
        why = unavailable()
        if why is None:
            try:
                run = builder(ctx)
            except Unsupported as e:
                why = str(e)
            else:
                if op not in CUDNN_OPS:
                    route, why, run = weight_gradient_route(ctx, run, fallback)
                    if route != "cudnn":
                        CHOSEN["im2col", why] += 1
                        return run
                CHOSEN["cudnn", op] += 1
                if getattr(run, "operands", None) == BFLOAT16:
                    IN_BFLOAT16[op] += 1
                return run
        CHOSEN["im2col", why] += 1
        return fallback(ctx)
    factory.__name__ = f"{op}_cudnn_or_im2col"
    return factory


def _specialiser(op: str, builder):
    def make(fallback):
        return _choosing(op, builder, fallback)
    make.__qualname__ = f"cudnn_over_im2col[{op}]"
    return make


# the cuDNN kernels in place of arrays.py's im2col ones, each keeping its im2col kernel as the fallback
for _op, _builder in BUILDERS.items():
    KERNELS.specialise(_op, "gpu", SPECIALISED)(_specialiser(_op, _builder))

# a run records the routes measured here with its checkpoints, and a resumed run takes them again
# (dnn_routes.py; training reaches them through backend/measured.py)
register_measured("gpu", "convolution_routes", lambda: export_routes(unavailable()),
                  lambda data: adopt_routes(data, unavailable()))
