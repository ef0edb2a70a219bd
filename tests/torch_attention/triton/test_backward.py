"""``torch_attention/triton/backward.py``, the two backward kernels (dK, dV per key block; dQ in
its own pass): dq, dk, dv against the float64 NumPy golden's hand-derived backward, in float32,
from each upstream alone (the output's, which the kernels turn into delta = rowsum(dO * O), and
lse's, which enters dS as dlse * P), under GQA (dk and dv summed over a kv head's query heads)
and the options that change dS (causal, a window, softcap, ALiBi). Both upstreams together, the
other dtypes, determinism and the block edges: test_launch.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .conftest import NEEDS_TRITON

pytest.importorskip("triton", reason=NEEDS_TRITON)

from numpy_attention.functional import attention_backward, attention_forward  # noqa: E402
from torch_attention.functional import attention  # noqa: E402

OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window": (4, 2)},
    "softcap": {"softcap": 2.0},
    "alibi": {"alibi_slopes": np.array([0.25, 0.5, 0.125, 0.0625]), "align": "bottom-right"},
}
TOLERANCE = 2e-5  # of max|G|: float32 rounding of a backward over a few dozen terms, with room


def _float32(t: np.ndarray) -> np.ndarray:
    return torch.from_numpy(t).float().double().numpy()


@pytest.mark.parametrize("upstream", ["out", "lse"])
@pytest.mark.parametrize("name", OPTIONS)
def test_gradients_from_each_upstream_are_the_golden(name, upstream, device):
    rng = np.random.default_rng(1)
    q = _float32(rng.standard_normal((1, 4, 21, 16)) * 3**0.5)  # 4 query heads ...
    k = _float32(rng.standard_normal((1, 2, 35, 16)) * 3**0.5)  # ... read 2 kv heads
    v = _float32(rng.standard_normal((1, 2, 35, 24)))
    dout = rng.standard_normal((1, 4, 21, 24)) * (upstream == "out")
    dlse = rng.standard_normal((1, 4, 21)) * (upstream == "lse")
    options = {"enable_gqa": True, **OPTIONS[name]}

    leaves = [torch.from_numpy(t).float().to(device).requires_grad_(True) for t in (q, k, v)]
    given = {
        key: torch.from_numpy(value).float().to(device) if isinstance(value, np.ndarray) else value
        for key, value in options.items()
    }
    result = attention(*leaves, backend="triton", return_lse=True, **given)
    grads = torch.autograd.grad(
        [result.out, result.lse],
        leaves,
        [torch.from_numpy(dout).float().to(device), torch.from_numpy(dlse).float().to(device)],
    )
    forward = attention_forward(q, k, v, return_lse=True, **options)
    gold = attention_backward(dout, forward.ctx, dlse=dlse)

    for tensor, ours, theirs in zip(("dq", "dk", "dv"), grads, gold[:3], strict=True):
        error = np.abs(ours.cpu().double().numpy() - theirs).max()
        scale = np.abs(theirs).max()
        if upstream == "lse" and tensor == "dv":  # lse does not depend on v
            assert scale == 0.0 and error == 0.0
        else:
            assert error <= TOLERANCE * scale, (tensor, error, scale)
