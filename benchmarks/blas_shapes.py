#!/usr/bin/env python
"""SGEMM rates of the BLAS libraries on a net's convolution GEMMs (O x K times K x P, one image),
1 and 2 threads: numpy's OpenBLAS, which the toolkit's generated kernels call, and MKL where its
runtime library is given (`pip install mkl` into another environment; --mkl PATH/libmkl_rt.so.3).

    python benchmarks/blas_shapes.py [NET.yaml] [--mkl PATH] [--threads 1 --threads 2]
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def conv_gemms(net_file: str) -> dict[tuple[int, int, int], int]:
    """(M, K, N) of each convolution's GEMM at batch 1 (O, Cg*kH*kW, OH*OW) -> how many."""
    sys.path.insert(0, str(ROOT))
    from toolkit.zoo.resolve import load_net
    shapes: dict[tuple[int, int, int], int] = {}
    for node in load_net(net_file).graph("infer", "float32").nodes:
        if node.op == "conv2d" and node.attrs["group"] == 1:
            w, y = node.inputs[1].shape, node.outputs[0].shape
            key = (int(w[0]), int(w[1] * w[2] * w[3]), int(y[2] * y[3]))
            shapes[key] = shapes.get(key, 0) + 1
    return shapes


def fastest(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("net", nargs="?", default=str(ROOT / "benchmarks" / "nets" / "resnet50.yaml"))
    p.add_argument("--mkl", metavar="PATH", help="MKL's runtime library (libmkl_rt.so.3)")
    p.add_argument("--threads", action="append", type=int, help="default: 1 and 2")
    args = p.parse_args()
    from threadpoolctl import threadpool_limits
    mkl = None
    if args.mkl:
        mkl = ctypes.CDLL(args.mkl)
        mkl.MKL_Set_Num_Threads.argtypes = [ctypes.c_int]
        mkl.cblas_sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                                          ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                                          ctypes.c_void_p, ctypes.c_int]
    shapes = conv_gemms(args.net)
    rng = np.random.default_rng(0)
    for threads in args.threads or [1, 2]:
        totals = {"OpenBLAS": 0.0, "MKL": 0.0}
        if mkl is not None:
            mkl.MKL_Set_Num_Threads(threads)
        print(f"| M x K x N (count) | OpenBLAS GFLOP/s | MKL GFLOP/s |  ({threads} thread(s))")
        print("|---|--:|--:|")
        for (m, k, n), count in sorted(shapes.items()):
            a, b = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
            c = np.empty((m, n), np.float32)
            with threadpool_limits(threads):
                t_open = fastest(lambda: np.matmul(a, b, out=c))
            totals["OpenBLAS"] += t_open * count
            rate_mkl = "-"
            if mkl is not None:
                t_mkl = fastest(lambda: mkl.cblas_sgemm(101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data,
                                                        n, 0.0, c.ctypes.data, n))
                if not np.allclose(c, a @ b, rtol=1e-3):
                    raise SystemExit("MKL's product differs from numpy's")
                totals["MKL"] += t_mkl * count
                rate_mkl = f"{2 * m * k * n / t_mkl / 1e9:.1f}"
            print(f"| {m} x {k} x {n} ({count}) | {2 * m * k * n / t_open / 1e9:.1f} | {rate_mkl} |")
        print(f"all of them, {threads} thread(s): OpenBLAS {totals['OpenBLAS'] * 1e3:.1f} ms"
              + (f", MKL {totals['MKL'] * 1e3:.1f} ms" if mkl is not None else "") + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
