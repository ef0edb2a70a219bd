"""The golden and baseline of the linear-attention specs' cases: ``numpy_attention.
linear_attention``'s recurrence of the case's spec (``LinearCase.variant``: the gated delta rule
for "fla_gdn", KDA for "fla_kda") in float64 (``form="recurrent"``, forward and its hand-derived
backward) on the inputs after their cast to the kernel's dtype, and the torch twin's
(``torch_attention.linear_attention.gated_delta_rule`` or ``kda``, ``form="recurrent"``,
autograd) in that dtype, its state float32 for half inputs, as the plain baseline the bounds
scale: the same recurrence with a float32 state, whose errors grow with T as a correct kernel's
do.

The state is float32 for half inputs, as flash-linear-attention keeps it: ``initial_state`` and
the final state's upstream gradient are given in float32 then (in the kernel's dtype
otherwise), and the final state is expected in float32; q, k, v, g, beta and o's upstream
gradient are in the kernel's dtype; ``cu_seqlens`` int64.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from numpy_attention import linear_attention as np_linear
from torch_attention import linear_attention as torch_linear

from ..battery.linear import LinearCase, make_linear_inputs
from . import DTYPES, to64

# The inputs that are leaves of the backward, by the name of their gradient.
GRADIENTS = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta",
             "initial_state": "dinitial_state"}  # fmt: skip
STATE_INPUTS = ("initial_state", "dfinal_state")


def state_dtype(dtype: str) -> str:
    """The dtype a state is kept in for inputs of ``dtype``: float32 for half precision."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


@functools.lru_cache(maxsize=256)
def linear_inputs(
    case: LinearCase, dtype: str, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """The arguments of a case as tensors (see the module docstring for their dtypes); shared by
    every kernel checked, which only ever gets copies."""
    drawn = make_linear_inputs(case, seed)
    tensors = {}
    for name, array in drawn._asdict().items():
        if array is None:
            continue
        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
        if name == "cu_seqlens":
            tensor = tensor.to(torch.int64)
        elif name in STATE_INPUTS:
            tensor = tensor.to(DTYPES[state_dtype(dtype)])
        else:
            tensor = tensor.to(DTYPES[dtype])
        tensors[name] = tensor
    return tensors


class Expected(NamedTuple):
    """Golden and baseline of a case: dicts of float64 arrays by tensor name."""

    golden: dict[str, np.ndarray]
    baseline: dict[str, np.ndarray]


@functools.lru_cache(maxsize=256)
def linear_expected(case: LinearCase, dtype: str, device: torch.device, seed: int) -> Expected:
    """The golden and the baseline of a case (cached)."""
    given = {name: to64(t) for name, t in linear_inputs(case, dtype, device, seed).items()}
    offsets = given.get("cu_seqlens")
    forward = getattr(np_linear, f"{case.variant}_forward")
    backward = getattr(np_linear, f"{case.variant}_backward")
    found = forward(
        given["q"], given["k"], given["v"], given["g"], given["beta"], scale=case.scale,
        initial_state=given.get("initial_state"), output_final_state=True,
        cu_seqlens=None if offsets is None else offsets.astype(np.int64), form="recurrent",
    )  # fmt: skip
    grads = backward(given["dout"], found.ctx, given["dfinal_state"])
    golden = {"out": found.out, "final_state": found.final_state, "dq": grads.dq,
              "dk": grads.dk, "dv": grads.dv, "dg": grads.dg, "dbeta": grads.dbeta}  # fmt: skip
    if grads.dinitial_state is not None:
        golden["dinitial_state"] = grads.dinitial_state
    return Expected(golden, _baseline(case, dtype, device, seed))


def _baseline(
    case: LinearCase, dtype: str, device: torch.device, seed: int
) -> dict[str, np.ndarray]:
    """The torch twin's recurrent form of the case's variant in the kernel's dtype (its state
    float32 for half inputs), its gradients by autograd through (o, final_state)."""
    inputs = linear_inputs(case, dtype, device, seed)
    leaves = {name: inputs[name].detach().clone().requires_grad_(True)
              for name in GRADIENTS if name in inputs}  # fmt: skip
    out, final = getattr(torch_linear, case.variant)(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], scale=case.scale,
        initial_state=leaves.get("initial_state"), output_final_state=True,
        cu_seqlens=inputs.get("cu_seqlens"), form="recurrent",
    )  # fmt: skip
    torch.autograd.backward([out, final], [inputs["dout"], inputs["dfinal_state"].to(final.dtype)])
    base = {"out": to64(out), "final_state": to64(final)}
    base.update({GRADIENTS[name]: to64(leaf.grad) for name, leaf in leaves.items()})
    return base
