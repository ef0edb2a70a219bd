"""The Triton kernel's tests run where Triton is installed (the optional extra ``triton``): on a
GPU when there is one, else on CPU under Triton's interpreter, which tests/conftest.py switches on
before Triton is first imported (Triton reads ``TRITON_INTERPRET`` then).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "triton",
    reason="the Triton kernel needs the optional extra 'triton': pip install -e '.[triton]'",
)

from torch_attention.triton import interpreted  # noqa: E402  (after the skip)

if not interpreted() and not torch.cuda.is_available():
    pytest.skip(
        "no GPU, and Triton was imported without TRITON_INTERPRET=1 (set it before Triton is "
        "first imported: tests/conftest.py does where no GPU is)",
        allow_module_level=True,
    )

DEVICE = "cpu" if interpreted() else "cuda"


@pytest.fixture
def device() -> str:
    """Where the kernels run: "cuda", or "cpu" under the interpreter."""
    return DEVICE
