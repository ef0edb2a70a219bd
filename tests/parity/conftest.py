"""The parity tests' fixtures: transformers' models run their reference PyTorch paths.

With flash-linear-attention installed (the extra ``fla``), transformers 5.23 binds the linear
layers of its hybrid models (Qwen3-Next, Qwen3.5, OLMo-hybrid, Bailing-hybrid, ...) to fla's
Triton kernels when their modules are imported (``integrations/hub_kernels.py``,
``use_kernel_func_from_hub_with_fallback``), and those kernels need a GPU driver: on a CPU they
raise "0 active drivers". The parity of the softmax layers inside those models does not depend on
which path the linear layers take, so every parity test runs transformers' own torch path, the
one it takes without fla and while exporting: the wrapper's check of
``is_torchdynamo_exporting`` is made to answer True (nothing else reads that module's name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest


@contextlib.contextmanager
def transformers_torch_paths() -> Iterator[None]:
    """transformers' hub-kernel wrappers take their torch path while this lasts (the opt-in
    error scripts, ``hf_errors`` and ``hf_latent_errors``, run under it too)."""
    try:
        import transformers.integrations.hub_kernels as hub_kernels
    except ImportError:  # without transformers nothing is bound
        yield
        return
    with mock.patch.object(hub_kernels, "is_torchdynamo_exporting", return_value=True):
        yield


@pytest.fixture(autouse=True)
def _transformers_torch_paths() -> Iterator[None]:
    with transformers_torch_paths():
        yield
