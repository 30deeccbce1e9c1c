"""Kernels, as plug-ins above the runtime: one folder per kind of device (``cpu/`` numpy,
``native/`` generated C for the host, ``gpu/`` CuPy), plus the control-flow kernels every kind
shares. Importing a kind's modules registers its kernels in the backend's registry, which loads
them by name (``Device.kernel_modules``) the first time that kind is asked for."""
