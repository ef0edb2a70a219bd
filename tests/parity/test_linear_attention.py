"""The twins of linear attention agree: ``numpy_attention.linear_attention`` (forward and its
backward derived by hand) against ``torch_attention.linear_attention`` (autograd through its own
recurrence) in float64, for the gated delta rule, KDA and simple GLA, both forms, batched and
packed, with an initial state and the final state differentiated too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_attention.linear_attention as tla
from numpy_attention import linear_attention as la

from ..conftest import assert_close

B, T, H, K, V = 2, 21, 2, 5, 3
PACKED = np.array([0, 6, 7, 7, 21])  # a one-token and an empty sequence among them
TWINS = {
    "gated_delta_rule": (la.gated_delta_rule_forward, la.gated_delta_rule_backward,
                         tla.gated_delta_rule),
    "kda": (la.kda_forward, la.kda_backward, tla.kda),
    "simple_gla": (la.simple_gla_forward, la.simple_gla_backward, tla.simple_gla),
}  # fmt: skip
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _inputs(rng, variant: str, packed: bool) -> dict[str, np.ndarray]:
    batch = 1 if packed else B
    sequences = len(PACKED) - 1 if packed else B
    k = rng.standard_normal((batch, T, H, K))
    found = {
        "q": rng.standard_normal((batch, T, H, K)),
        "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
        "v": rng.standard_normal((batch, T, H, V)),
        "g": -rng.uniform(0.02, 0.8, (batch, T, H, K) if variant == "kda" else (batch, T, H)),
        "initial_state": rng.standard_normal((sequences, H, K, V)),
    }
    if variant != "simple_gla":
        found["beta"] = rng.uniform(0.05, 0.95, (batch, T, H))
    return found


@pytest.mark.parametrize("packed", [False, True], ids=["batched", "packed"])
@pytest.mark.parametrize("form", ["recurrent", "chunk"])
@pytest.mark.parametrize("variant", sorted(TWINS))
def test_numpy_backward_equals_torch_autograd(rng, variant, form, packed):
    forward, backward, twin = TWINS[variant]
    arrays = _inputs(rng, variant, packed)
    options = {"scale": 0.4, "output_final_state": True, "form": form, "chunk_size": 4,
               "cu_seqlens": PACKED if packed else None}  # fmt: skip
    dout = rng.standard_normal((1 if packed else B, T, H, V))
    dfinal = rng.standard_normal(arrays["initial_state"].shape)

    found = forward(**arrays, **options)
    grads = backward(dout, found.ctx, dfinal)
    leaves = {name: torch.tensor(a, requires_grad=True) for name, a in arrays.items()}
    cu = None if options["cu_seqlens"] is None else torch.tensor(PACKED)
    out, final = twin(**leaves, **{**options, "cu_seqlens": cu})
    torch.autograd.backward((out, final), (torch.tensor(dout), torch.tensor(dfinal)))

    assert_close(found.out, out.detach().numpy(), name="out")
    assert_close(found.final_state, final.detach().numpy(), name="final_state")
    for name in (n for n in NAMES if n in leaves):
        mine = getattr(grads, f"d{name}")
        assert_close(mine, leaves[name].grad.numpy(), name=f"d{name}")
