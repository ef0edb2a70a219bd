"""The Triton kernel's tests run where Triton is installed (the optional extra ``triton``; each
test module skips without it, ``NEEDS_TRITON``): on a GPU when there is one, else on CPU under
Triton's interpreter, which tests/conftest.py switches on before Triton is first imported
(Triton reads ``TRITON_INTERPRET`` then).
"""

from __future__ import annotations

import pytest
import torch

NEEDS_TRITON = "the Triton kernel needs the optional extra 'triton': pip install -e '.[triton]'"


@pytest.fixture
def device() -> str:
    """Where the kernels run: "cpu" under the interpreter, else "cuda"."""
    from torch_attention.triton import interpreted

    if interpreted():
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip(
            "no GPU, and Triton was imported without TRITON_INTERPRET=1 (set it before Triton "
            "is first imported: tests/conftest.py does where no GPU is)"
        )
    return "cuda"
