"""Code generation: loop programs (loops.py), their C and CUDA dialects (render.py), the system
compiler with its on-disk cache (toolchain.py), numpy's BLAS reached from C (blas.py), and
native calls bound to a plan's arrays (native.py)."""
