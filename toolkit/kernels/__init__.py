"""Kernels: the (op, device, dtype) registry and the per-device implementations."""
from .registry import KERNELS, KernelContext, KernelMissing, load_device, register_kernel

__all__ = ["KERNELS", "KernelContext", "KernelMissing", "load_device", "register_kernel"]
