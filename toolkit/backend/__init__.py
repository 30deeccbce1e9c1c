"""The backend floor: ``Device`` kinds (devices.py), the kernel registry keyed by (op, device kind,
dtype) that loads a kind's kernels by name (registry.py), where each node runs (placement.py),
and the ``--device``/``--dtype`` options (options.py)."""
