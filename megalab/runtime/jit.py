"""megalab's Triton kernels, jitted once per interpreter mode.

The kernels are plain functions in their modules (flat_adam.py, triton_norm.py, param_grad.py, bias_gelu.py,
dropout_add.py, qkv_split.py) and are jitted here on first use, keyed by TRITON_INTERPRET's value: the CPU tests
run them in Triton's interpreter, which must be chosen before a kernel is jitted, and a process may use both modes
(a test's fresh interpreter). `sms` sizes their grids.
"""
from __future__ import annotations

import functools
import os

try:  # Triton comes with CUDA torch (and megalab's CPU venv: Megatron imports it)
    import triton
except ImportError:  # pragma: no cover
    triton = None

_KERNELS: dict = {}  # (module, function, TRITON_INTERPRET's value) -> the jitted kernel


def kernel(fn):
    """`fn` jitted by Triton, once per interpreter mode."""
    key = (fn.__module__, fn.__name__, os.environ.get("TRITON_INTERPRET", "0"))
    if key not in _KERNELS:
        _KERNELS[key] = triton.jit(fn)
    return _KERNELS[key]


@functools.cache
def sms(device) -> int:
    """The GPU's streaming multiprocessors, which the kernels' grids are sized by; 1 in Triton's interpreter (CPU
    tensors), so that the tests see programs walk several blocks and a ragged last one."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1
