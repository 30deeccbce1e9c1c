"""Convolutions through cuDNN, called through ctypes on a handle of our own, so that a CUDA graph
can capture them (runtime/capture.py) as it captures blas.py's GEMMs.

The forward convolution (``conv2d`` with its bias, also as the head of a fused epilogue), the fused
``conv2d_max_pool2d`` (cuDNN's convolution, then the max over the pooling windows on CuPy) and
the input gradient (``conv2d_grad_input``) take over from the im2col kernels of arrays.py, which
stay as each one's fallback: when cuDNN cannot be loaded, when the ``cudnn`` setting is off
(``TOOLKIT_CUDNN=0``), for a dtype cuDNN does not take, or when cuDNN offers no algorithm for the
shapes. The weight gradient (``conv2d_grad_weight``) goes to cuDNN or stays on im2col + cuBLAS
per convolution, when the plan is built (``weight_gradient_route``): cuDNN where im2col's column
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
- the math: float32 follows the precision policy (``policy``): ``strict`` (the default) holds it
  to FMA kernels (``CUDNN_FMA_MATH``), so results equal the CPU's to float32 rounding; ``tf32``
  is PyTorch's default (``torch.backends.cudnn.allow_tf32``): cuDNN's default math, which lets
  all three directions run on TF32 tensor cores on Ampere and later (cuBLAS's GEMMs stay float32
  under both, as PyTorch's ``matmul.allow_tf32`` default). float16 may use Tensor Cores and
  accumulates in float32; so does bfloat16, which CuPy cannot hold: a float32 convolution with
  an operand rounded to bfloat16 (``operand_type``) runs on bfloat16 copies of its operands.
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
import statistics
import threading
from collections import Counter

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import KERNELS, SPECIALISED
from ...ops.conv import conv_out_size
from ...ops.fused import split_attrs
from ...settings import current, off_text, precision_policy
from . import blas

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
# float32 on tensor cores
BFLOAT16 = "bfloat16"
BFLOAT16_TYPES = (DATA_BFLOAT16, DATA_FLOAT, MATH_TENSOR_OP, ctypes.c_float)
# the math type float32 asks for under each policy: tf32 as PyTorch sets it with allow_tf32
# (cuDNN's default math, which may convert to TF32; FMA only when TF32 is not allowed)
FLOAT32_MATH = {"strict": MATH_FMA, "tf32": MATH_DEFAULT}
MAX_ALGORITHMS = 16


def policy(ctx=None) -> str:
    """The float32 math policy in force for a kernel built from ``ctx``: the ``precision`` setting
    (``TOOLKIT_PRECISION``, ``--precision``) where given, else the net file's ``precision`` key
    (``ctx.precision``), else strict."""
    return precision_policy(getattr(ctx, "precision", None))


def workspace_limit() -> int:
    """The most bytes of workspace one convolution may use (the ``cudnn_workspace_mb`` setting)."""
    return current().cudnn_workspace_mb << 20


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


def operand_type(ctx) -> str:
    """The type a float32 convolution's operands are summed in: bfloat16 where one of them is a
    value rounded to bfloat16 (mixed precision in bfloat16 on a device without bfloat16 arrays:
    passes/precision.py stores each bfloat16 value as float32, each cast to it a
    ``round_precision``, and rounds the result of every convolution whose operands are bfloat16),
    else the kernel's dtype. A convolution reached only through other ops (a gradient after a
    ReLU's) stays float32, its result rounded all the same."""
    if np.dtype(ctx.dtype) == np.float32:
        for v in getattr(getattr(ctx, "node", None), "inputs", ()):
            producer = getattr(v, "producer", None)
            if producer is not None and producer.op == "round_precision" and producer.attrs.get("dtype") == BFLOAT16:
                return BFLOAT16
    return str(np.dtype(ctx.dtype))


# float32 <-> bfloat16 bits, rounding to nearest even (a NaN stays a NaN), one thread per element
# in a grid-stride loop
BFLOAT16_SOURCE = r"""
union tk_bits { float f; unsigned int u; };
extern "C" __global__ void tk_to_bfloat16(const float *x, unsigned short *y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)blockDim.x * gridDim.x) {
        union tk_bits b;
        b.f = x[i];
        if ((b.u & 0x7f800000u) == 0x7f800000u && (b.u & 0x7fffffu)) y[i] = (unsigned short)((b.u >> 16) | 0x40u);
        else y[i] = (unsigned short)((b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16);
    }
}
extern "C" __global__ void tk_from_bfloat16(const unsigned short *x, float *y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)blockDim.x * gridDim.x) {
        union tk_bits b;
        b.u = (unsigned int)x[i] << 16;
        y[i] = b.f;
    }
}
"""


class _InBfloat16:
    """A bfloat16 convolution on float32 arrays: both operands converted into bfloat16 buffers,
    the convolution on them, its bfloat16 result widened into the float32 output (which the
    graph then rounds to bfloat16 again: a no-op). The buffers are parts of the stream's own
    scratch (``Handle.scratch``), shared by every convolution run on that stream one after
    another, so a net's bfloat16 copies take the largest convolution's room, not the sum."""

    ALIGN = 128                  # elements (256 bytes) between the parts, as cuDNN's kernels like

    def __init__(self, conv: Convolution, a_shape, b_shape, out_shape):
        from .cuda import MAX_BLOCKS, THREADS_PER_BLOCK, compiled_source
        self.conv = conv
        self.parts, start = [], 0
        for shape in (a_shape, b_shape, out_shape):
            size = int(np.prod(shape, dtype=np.int64))
            self.parts.append((start, size, tuple(int(v) for v in shape)))
            start += -(-size // self.ALIGN) * self.ALIGN
        self.elements = start
        self.to_bits = compiled_source(BFLOAT16_SOURCE, "tk_to_bfloat16")
        self.from_bits = compiled_source(BFLOAT16_SOURCE, "tk_from_bfloat16")
        self.grid = lambda n: ((max(1, min(MAX_BLOCKS, -(-n // THREADS_PER_BLOCK))),), (THREADS_PER_BLOCK,))

    def __call__(self, a, b, out) -> None:
        scratch = handle().scratch(self.elements)
        a_bits, b_bits, out_bits = (scratch[o:o + n].reshape(shape) for o, n, shape in self.parts)
        for src, bits in ((a, a_bits), (b, b_bits)):
            self.to_bits(*self.grid(bits.size), (src, bits, np.int64(bits.size)))
        self.conv(a_bits, b_bits, out_bits)
        self.from_bits(*self.grid(out_bits.size), (out_bits, out, np.int64(out_bits.size)))


# each op the bfloat16 convolutions ran, for benchmarks and tests to read
IN_BFLOAT16: Counter = Counter()

# cudnnConvolutionFwdAlgo_t: the one algorithm cudnnConvolutionBiasActivationForward runs a ReLU
# with; cudnnActivationMode_t, cudnnNanPropagation_t
IMPLICIT_PRECOMP_GEMM = 1
ACTIVATION_RELU, PROPAGATE_NAN = 1, 1


def relu_epilogue(program, outputs, views, k: int, n_inputs: int) -> tuple[bool, int | None] | None:
    """(True, residual input's position or None) when a convolution-with-bias head's epilogue
    program is exactly ``relu(h)`` or ``relu(h + z)`` with only the ReLU leaving the group (what
    cudnnConvolutionBiasActivationForward computes); None otherwise."""
    if any(views or ()) or k != 3:
        return None
    steps = tuple((step[0], tuple(tuple(a) for a in step[1]), tuple(step[2])) for step in program)
    if steps == (("relu", (("h",),), ()),) and tuple(outputs) == (0,):
        return True, None
    if len(steps) != 2 or tuple(outputs) != (1,) or steps[1] != ("relu", (("t", 0),), ()):
        return None
    op, args, extra = steps[0]
    if op != "add" or extra or len(args) != 2 or ("h",) not in args:
        return None
    other = args[0] if args[1] == ("h",) else args[1]
    if other[0] != "x" or not k <= other[1] < n_inputs:
        return None
    return True, other[1]


class BiasActivation:
    """y = relu(conv(x, w) + b (+ z)) in one cuDNN call, with the algorithm it allows a ReLU."""

    def __init__(self, x_shape, w_shape, y_shape, attrs, dtype, precision: str):
        lib = library()
        if not getattr(lib, "fused_forward", False):
            raise Unsupported("this cuDNN has no cudnnConvolutionBiasActivationForward")
        conv = self.conv = Convolution("forward", x_shape, w_shape, y_shape, attrs, dtype, precision=precision)
        if conv.math != MATH_FMA:       # the ranking left the descriptor at its own choice's math
            check(lib.cudnnSetConvolutionMathType(conv.conv, conv.math), "cudnnSetConvolutionMathType")
        raw, _ = handle().on_current_stream()
        size = ctypes.c_size_t(0)
        status = lib.cudnnGetConvolutionForwardWorkspaceSize(raw, conv.x, conv.w, conv.conv, conv.y,
                                                             IMPLICIT_PRECOMP_GEMM, ctypes.byref(size))
        if status != 0 or size.value > workspace_limit():
            raise Unsupported("no implicit precomputed GEMM within the workspace bound")
        self.workspace_bytes = size.value
        self.bias = tensor_descriptor((1, int(w_shape[0]), 1, 1), conv.data_type)
        self.activation = _descriptor("cudnnCreateActivationDescriptor", "cudnnSetActivationDescriptor",
                                      ACTIVATION_RELU, PROPAGATE_NAN, ctypes.c_double(0.0))

    def __call__(self, x, w, b, z, y) -> None:
        conv, lib = self.conv, library()
        raw, workspace = handle().on_current_stream(self.workspace_bytes)
        check(lib.cudnnConvolutionBiasActivationForward(
            raw, ctypes.byref(conv.one), conv.x, ctypes.c_void_p(blas.pointer(x)), conv.w,
            ctypes.c_void_p(blas.pointer(w)), conv.conv, IMPLICIT_PRECOMP_GEMM, ctypes.c_void_p(workspace),
            self.workspace_bytes, ctypes.byref(conv.zero if z is None else conv.one), conv.y,
            ctypes.c_void_p(blas.pointer(y if z is None else z)), self.bias, ctypes.c_void_p(blas.pointer(b)),
            self.activation, conv.y, ctypes.c_void_p(blas.pointer(y))), "cudnnConvolutionBiasActivationForward")


# (shapes, attributes, dtype, policy, residual or not) -> whether the fused call measured faster
FUSED_ROUTES: dict[tuple, bool] = {}
# each fused epilogue built as one cuDNN call, by its form
FUSED: Counter = Counter()


def epilogue_convolution(ctx, head_attrs, k: int, separate):
    """run(ins, outs) -> True doing a fused epilogue's convolution, bias, residual add and ReLU in
    one cudnnConvolutionBiasActivationForward, where the group is exactly that, cuDNN takes it,
    and it measures faster than ``separate`` (the head's kernel then the epilogue's, timed once
    per shapes, dtype and policy in the process; where nothing can be timed, the two kernels
    stay). None where it does not apply; the run returns False for operands not contiguous."""
    if unavailable() or str(np.dtype(ctx.dtype)) not in ("float32", "float16"):
        return None
    found = relu_epilogue(ctx.attrs["program"], ctx.attrs["outputs"], ctx.attrs.get("views"), k, len(ctx.in_shapes))
    if found is None or len(ctx.out_shapes) != 1:
        return None
    _relu, residual = found
    x_shape, w_shape, b_shape = (tuple(int(v) for v in s) for s in ctx.in_shapes[:3])
    y_shape = tuple(int(v) for v in ctx.out_shapes[0])
    if b_shape not in ((w_shape[0],), (1, w_shape[0], 1, 1)) or operand_type(ctx) == BFLOAT16:
        return None
    if residual is not None and tuple(ctx.in_shapes[residual]) != y_shape:
        return None
    if any(getattr(v, "dtype", ctx.dtype) != ctx.dtype for v in getattr(ctx.node, "inputs", ())):
        return None
    key = (x_shape, w_shape, y_shape, tuple(sorted((n, repr(v)) for n, v in head_attrs.items())),
           str(np.dtype(ctx.dtype)), policy(ctx), residual is not None)
    if FUSED_ROUTES.get(key) is False:
        return None
    try:
        fused = BiasActivation(x_shape, w_shape, y_shape, head_attrs, ctx.dtype, policy(ctx))
    except (Unsupported, CudnnError):
        FUSED_ROUTES[key] = False
        return None

    def run(ins, outs) -> bool:
        operands = [ins[0], ins[1], ins[2], None if residual is None else ins[residual], outs[0]]
        if not all(a is None or a.flags.c_contiguous for a in operands):
            return False
        fused(*operands)
        return True

    if key not in FUSED_ROUTES:
        try:
            times = [seconds_on_device(candidate, ctx.in_shapes, y_shape, ctx.dtype) for candidate in (run, separate)]
        except CudnnError:                # cuDNN refused it when it ran: the two kernels stay
            times = [None]
        FUSED_ROUTES[key] = None not in times and times[0] < times[1]
    if not FUSED_ROUTES[key]:
        return None
    FUSED["relu(conv + b + z)" if residual is not None else "relu(conv + b)"] += 1
    return run


def _convolution(direction: str, x_shape, w_shape, y_shape, attrs, dtype, precision: str, operands: str):
    """call(a, b, out) for ``direction`` on packed arrays of ``dtype``: cuDNN in that type, or on
    bfloat16 copies of the operands where ``operands`` is bfloat16 (``operand_type``)."""
    if operands != BFLOAT16:
        return Convolution(direction, x_shape, w_shape, y_shape, attrs, dtype, precision=precision)
    conv = Convolution(direction, x_shape, w_shape, y_shape, attrs, BFLOAT16)
    shapes = {"forward": (x_shape, w_shape, y_shape), "data": (w_shape, y_shape, x_shape),
              "filter": (x_shape, y_shape, w_shape)}[direction]
    return _InBfloat16(conv, *shapes)


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
    window's strided view of it (the fusion pass guarantees unpadded, floor-mode windows)."""
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

    def run(ins, outs):
        forward(ins, conv_out)
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
# gradient is measured per convolution instead (``weight_gradient_route``): on the small ResNet's
# layers at batch 64 cuDNN's deterministic weight-gradient algorithms took 138 us where im2col
# took 91 (1x1 and 16-channel 3x3 layers 1.5x to 4.2x slower), but im2col's column buffer grows
# with the batch and the image (gigabytes for ResNet-50's first layers at batch 256).
CUDNN_OPS = {"conv2d", "conv2d_max_pool2d", "conv2d_grad_input"}
WEIGHT_GRADIENT_REASON = "im2col + cuBLAS measured faster than cuDNN's deterministic algorithms"
UNTIMED_REASON = "no device clock to measure the weight gradient's two routes by: im2col + cuBLAS"
TIMING_RUNS = 5

# what each convolution kernel built so far ran on: ("cudnn", op) or ("im2col", why), for
# benchmarks and tests to read
CHOSEN: Counter = Counter()
# each weight gradient's route, decided once in the process: key -> ("cudnn" or "im2col", why)
WEIGHT_GRADIENT_ROUTES: dict[tuple, tuple[str, str]] = {}
# the median seconds each route measured where both were timed: key -> {"cudnn": s, "im2col": s}
WEIGHT_GRADIENT_TIMES: dict[tuple, dict[str, float]] = {}


def column_bytes(x_shape, w_shape, g_shape, dtype) -> int:
    """The bytes of im2col's column buffer for a weight gradient (kernels/cpu/conv.py's ``cols``:
    every kernel tap of every input channel at every output position of every image)."""
    n, c = x_shape[:2]
    _o, _cg, kh, kw = w_shape
    oh, ow = g_shape[2:]
    return int(c) * int(kh) * int(kw) * int(n) * int(oh) * int(ow) * np.dtype(dtype).itemsize


def seconds_on_device(run, shapes: list, out_shape, dtype) -> float | None:
    """The median time of ``run`` over ``TIMING_RUNS`` runs after one untimed, on random inputs
    of ``shapes``, by CUDA events on the current stream; None where the array module has no
    events to time by (the numpy stand-in for CuPy: its tests replace this function)."""
    cp = gpu_module()
    events = getattr(cp.cuda, "Event", None)
    if events is None:
        return None
    # drawn on the device: a batch-256 activation is hundreds of MB, slow to draw on the host
    ins = [cp.random.standard_normal(tuple(shape)).astype(dtype) for shape in shapes]
    outs = [cp.empty(tuple(out_shape), dtype)]
    run(ins, outs)
    samples = []
    for _ in range(TIMING_RUNS):
        start, end = events(), events()
        start.record()
        run(ins, outs)
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    del ins, outs
    # the inputs' blocks back to the device, not kept in CuPy's pool beside the plan's memory
    pool = getattr(cp, "get_default_memory_pool", None)
    if pool is not None:
        pool().free_all_blocks()
    return statistics.median(samples)


def weight_gradient_route(ctx, cudnn_run, im2col_factory) -> tuple[str, str, object]:
    """(route, why, run) for a weight gradient whose cuDNN kernel is ``cudnn_run``: cuDNN where
    im2col's column buffer would be over the workspace bound; else whichever measures faster,
    each timed once (``seconds_on_device``; im2col where nothing can be timed). The choice is
    kept per (shapes, attributes, dtype, policy, bound) for the process, so that two plans of one
    net (captured and kernel by kernel) compute the gradient alike."""
    g_shape, x_shape = (tuple(int(v) for v in s) for s in ctx.in_shapes)
    w_shape = tuple(int(v) for v in ctx.out_shapes[0])
    key = (g_shape, x_shape, w_shape, tuple(sorted((k, repr(v)) for k, v in ctx.attrs.items())),
           getattr(cudnn_run, "operands", str(np.dtype(ctx.dtype))), policy(ctx), workspace_limit())
    known = WEIGHT_GRADIENT_ROUTES.get(key)
    if known is not None:
        route, why = known
        return route, why, cudnn_run if route == "cudnn" else im2col_factory(ctx)
    columns, limit = column_bytes(x_shape, w_shape, g_shape, ctx.dtype), workspace_limit()
    if columns > limit:
        route, why, run = "cudnn", (f"im2col's column buffer would take {columns / 2**20:,.0f} MiB, over the "
                                    f"{limit >> 20} MiB workspace bound"), cudnn_run
    else:
        im2col_run = im2col_factory(ctx)
        times = {name: seconds_on_device(candidate, [g_shape, x_shape], w_shape, ctx.dtype)
                 for name, candidate in (("cudnn", cudnn_run), ("im2col", im2col_run))}
        WEIGHT_GRADIENT_TIMES[key] = times
        if None in times.values():
            route, why, run = "im2col", UNTIMED_REASON, im2col_run
        elif times["cudnn"] < times["im2col"]:
            route, why, run = "cudnn", "cuDNN measured faster than im2col + cuBLAS", cudnn_run
        else:
            route, why, run = "im2col", WEIGHT_GRADIENT_REASON, im2col_run
    WEIGHT_GRADIENT_ROUTES[key] = (route, why)
    return route, why, run


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


def decisions() -> dict:
    """What this process's GPU convolutions were built as, for benchmarks to print: the kernels
    by route, the ops run in bfloat16, the fused epilogues, and each weight gradient's route with
    the two times it measured (microseconds; absent where it was not timed)."""
    def shapes(key):
        return f"g{list(key[0])} x{list(key[1])} w{list(key[2])} {key[4]} {key[5]}"
    return {
        "kernels": {f"{how}: {what}": n for (how, what), n in sorted(CHOSEN.items())},
        "bfloat16": dict(IN_BFLOAT16),
        "fused_epilogues": dict(FUSED),
        "weight_gradients": [
            {"shapes": shapes(key), "route": route, "why": why,
             **{f"{name}_us": round(t * 1e6, 1) for name, t in WEIGHT_GRADIENT_TIMES.get(key, {}).items()
                if t is not None}}
            for key, (route, why) in WEIGHT_GRADIENT_ROUTES.items()],
    }
