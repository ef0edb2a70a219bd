"""What a kernel is judged against: for each case, the float64 golden G (``numpy_attention``'s
reference, on the inputs *after* their cast to the kernel's dtype, so that input rounding is not
charged to the kernel) and the plain same-dtype baseline Bl the bound scales, cached per (case,
dtype, device, seed) and shared by every kernel checked. One pair of modules per family of
cases: ``attention`` with ``attention_baseline`` (kernels over whole sequences), ``decode`` with
``decode_baseline`` (kernels over a cache), and ``sparse``, ``linear`` and ``serving`` likewise.
This module holds what they share: the dtypes by name, tensors as float64 arrays, and
``forget``, which empties every family's caches (a calibration over many seeds calls it after
each seed: a past seed's cases are never asked for again, and the caches, bounded by count,
would otherwise hold gigabytes of them).

Tests: tests/checker/golden/
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

# the modules whose functions cache a case's inputs, golden and baseline
CACHING = ("attention", "decode", "sparse", "linear", "serving")

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def to64(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as a float64 NumPy array on the CPU (a bool tensor stays bool)."""
    if tensor.dtype == torch.bool:
        return tensor.cpu().numpy()
    return tensor.detach().to("cpu", torch.float64).numpy()


def stored(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float64 array rounded to ``dtype`` (bfloat16 included, through torch) and back."""
    return to64(torch.from_numpy(array).to(DTYPES[dtype]))


def forget() -> int:
    """Empty the caches of every family's golden (``CACHING``); returns how many entries went."""
    gone = 0
    for name in CACHING:
        module = importlib.import_module(f"{__name__}.{name}")
        for value in vars(module).values():
            clear = getattr(value, "cache_clear", None)
            if clear is not None and getattr(value, "__module__", None) == module.__name__:
                gone += value.cache_info().currsize
                clear()
    return gone
