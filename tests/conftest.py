"""Shared test pieces: the seeded rng, NumPy <-> torch converters, the one ``assert_close`` and
``assert_gradcheck``.

No test invents its own tolerance: each picks one of the constants of
``parity_tests.tolerances`` (FLOAT64_RTOL, FLOAT32_RTOL, FLOAT16_RTOL, GRADCHECK_RTOL), through
``assert_close`` or ``assert_gradcheck``.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from parity_tests.tolerances import GRADCHECK_RTOL, rel_error, rtol_for


def _interpret_triton_without_a_gpu() -> None:
    """Switch Triton's interpreter on where Triton is installed and no GPU is, so that
    tests/torch_attention/triton/ runs the project's kernel on CPU. Triton reads
    ``TRITON_INTERPRET`` when it is first imported (its own library is decorated then), and
    test modules import it early (through transformers and torch.compile): so here, before any
    test module. A value already set is left alone."""
    if "TRITON_INTERPRET" in os.environ or importlib.util.find_spec("triton") is None:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_interpret_triton_without_a_gpu()

SEED = 20261121


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator with a fixed seed per test, so every run sees the same numbers."""
    return np.random.default_rng(SEED)


def to_torch(array, *, device: str = "cpu", requires_grad: bool = False):
    """A NumPy array as a torch tensor of the same dtype (bool masks stay bool)."""
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def to_numpy(tensor) -> np.ndarray:
    """A torch tensor (any device) as a NumPy array."""
    return tensor.detach().cpu().numpy()


def assert_close(actual, expected, *, dtype=None, name: str = "", scale: float = 0.0) -> None:
    """Norm-wise relative error within the suite's tolerance for ``dtype`` (default: expected's).

    float64 -> FLOAT64_RTOL, float32 -> FLOAT32_RTOL, float16 -> FLOAT16_RTOL (a result computed
    in float32 and rounded once to float16, against a float64 golden on the same float16 inputs).
    Shapes must match exactly. Each tensor is judged on its own scale. ``scale`` floors the
    denominator, only for a tensor that is structurally zero (zero in exact arithmetic, both sides
    rounding noise), on the scale of the tensor whose rounding it carries, as
    ``parity_tests.tolerances.structural_floors`` gives it; the calling test says why.
    """
    actual = to_numpy(actual) if hasattr(actual, "detach") else np.asarray(actual)
    expected = to_numpy(expected) if hasattr(expected, "detach") else np.asarray(expected)
    rtol = rtol_for(dtype if dtype is not None else expected.dtype)
    error = rel_error(actual, expected, scale=scale)
    assert error <= rtol, f"{name or 'value'}: relative error {error:.3e} > {rtol:.1e}"


def assert_gradcheck(report) -> None:
    """Every tensor of a ``numpy_attention.gradcheck`` report within GRADCHECK_RTOL."""
    bad = [row for row in report.rows if not row.max_rel <= GRADCHECK_RTOL]
    assert not bad, f"gradcheck above {GRADCHECK_RTOL:.0e}:\n{report}"
