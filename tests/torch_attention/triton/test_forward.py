"""``torch_attention/triton/forward.py``, the forward kernel alone: called on inputs that do not
require grad (no backward is prepared), its out and its lse (natural log, float32) against the
float64 NumPy golden, option by option, in float32 (the interpreter's dots are IEEE float32, so
the error is float32 rounding); a row with nothing to see gives out 0 and lse -inf. Every
gradient, the other dtypes and the block edges: test_launch.py; the backward: test_backward.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .conftest import NEEDS_TRITON

pytest.importorskip("triton", reason=NEEDS_TRITON)

from numpy_attention.functional import attention_forward  # noqa: E402
from torch_attention.functional import attention  # noqa: E402

BR = "bottom-right"
OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "causal-bottom-right": {"causal": True, "align": BR},
    "window": {"window": (3, 5)},
    "softcap": {"softcap": 2.0},
    "alibi": {"alibi_slopes": np.array([0.25, 0.5, 0.125, 0.0625])},
    "gqa": {"enable_gqa": True},
    "scale": {"scale": 0.3},
}
TOLERANCE = 1e-5  # of max|G|: float32 rounding over a few dozen terms, with room


def _inputs(seed: int = 0, n: int = 19, m: int = 33, logits: float = 3.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 4, n, 16)) * logits**0.5
    k = rng.standard_normal((2, 2, m, 16)) * logits**0.5
    v = rng.standard_normal((2, 2, m, 24))
    return (torch.from_numpy(t).float().double().numpy() for t in (q, k, v))  # float32 numbers


def _run(q, k, v, device, **options):
    given = {
        name: torch.from_numpy(value).float().to(device) if isinstance(value, np.ndarray) else value
        for name, value in options.items()
    }
    tensors = (torch.from_numpy(t).float().to(device) for t in (q, k, v))
    return attention(*tensors, backend="triton", return_lse=True, **given)


@pytest.mark.parametrize("name", OPTIONS)
def test_out_and_lse_are_the_golden_to_float32_rounding(name, device):
    q, k, v = _inputs()
    options = dict(OPTIONS[name])
    if name != "gqa":  # one kv head per query head elsewhere
        k, v = k.repeat(2, axis=1), v.repeat(2, axis=1)

    result = _run(q, k, v, device, **options)
    gold = attention_forward(q, k, v, return_lse=True, **options)

    assert result.out.grad_fn is None and result.out.dtype == torch.float32
    assert result.lse.dtype == torch.float32
    for ours, theirs in ((result.out, gold.out), (result.lse, gold.lse)):
        error = np.abs(ours.cpu().double().numpy() - theirs).max()
        assert error <= TOLERANCE * np.abs(theirs).max(), (name, error)


def test_a_row_with_nothing_to_see_gives_zero_and_minus_inf(device):
    q, k, v = _inputs(n=6, m=4)
    k, v = k.repeat(2, axis=1), v.repeat(2, axis=1)

    result = _run(q, k, v, device, window=(0, 0), align="top-left")  # rows 4, 5: no key at p_i

    assert torch.equal(result.out[..., 4:, :].cpu(), torch.zeros(2, 4, 2, 24))
    assert torch.isneginf(result.lse[..., 4:]).all() and torch.isfinite(result.lse[..., :4]).all()
