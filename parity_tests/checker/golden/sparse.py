"""The golden and baseline of the sparse specs' cases: ``numpy_attention.sparse`` in float64
(forward and its hand-derived backward) on the inputs after their cast to the kernel's dtype,
and ``torch_attention.sparse`` (autograd) in that dtype as the plain baseline the bounds scale.

Beside the core's out and lse (sink included, -inf for a row with nothing to see), FlashMLA's
conventions (``flash_mla_sparse``): ``lse_mla``, the log-sum-exp of the scores alone (the sink
scales the output and is no part of lse), +inf for a lonely query; ``max_logits``, the largest
scaled score, -inf for a lonely query (FlashMLA's tests/ref.py defines both so).

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

from numpy_attention import sparse as np_sparse
from torch_attention.sparse import sparse_attention

from ..battery.sparse import SparseCase, make_sparse_inputs
from . import DTYPES, to64

GRADIENTS = {"q": "dq", "k": "dk", "v": "dv", "sinks": "dsinks"}


@functools.lru_cache(maxsize=256)
def sparse_inputs(
    case: SparseCase, dtype: str, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """The arguments of a case as tensors: q, k, v and dout in the kernel's dtype, sinks in it
    too ("sparse") or float32 (FlashMLA's), indices and topk_length int32; shared by every
    kernel checked, which only ever gets copies."""
    drawn = make_sparse_inputs(case, seed)
    tensors = {}
    for name, array in drawn._asdict().items():
        if array is None:
            continue
        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
        if name in ("indices", "topk_length"):
            tensor = tensor.to(torch.int32)
        elif name == "sinks" and case.spec == "flash_mla_sparse":
            tensor = tensor.to(torch.float32)
        else:
            tensor = tensor.to(DTYPES[dtype])
        tensors[name] = tensor
    return tensors


class Expected(NamedTuple):
    """Golden and baseline of a case: dicts of float64 arrays by tensor name."""

    golden: dict[str, np.ndarray]
    baseline: dict[str, np.ndarray]


@functools.lru_cache(maxsize=256)
def sparse_expected(case: SparseCase, dtype: str, device: torch.device, seed: int) -> Expected:
    """The golden and the baseline of a case (cached)."""
    given = {name: to64(t) for name, t in sparse_inputs(case, dtype, device, seed).items()}
    indices = given["indices"].astype(np.int64)
    lengths = given.get("topk_length")
    lengths = None if lengths is None else lengths.astype(np.int64)
    arguments = {"softmax_scale": case.scale, "topk_length": lengths,
                 "d_v": case.dv if case.latent else None}  # fmt: skip
    found = np_sparse.sparse_attention_forward(
        given["q"], given["k"], given.get("v"), indices, sinks=given.get("sinks"),
        return_lse=True, **arguments,
    )  # fmt: skip
    golden = {"out": found.out, "lse": found.lse}
    if case.spec == "sparse":  # FlashMLA's is forward only
        grads = np_sparse.sparse_attention_backward(given["dout"], found.ctx)
        golden.update(dq=grads.dq, dk=grads.dk)
        if grads.dv is not None:
            golden["dv"] = grads.dv
        if grads.dsinks is not None:
            golden["dsinks"] = grads.dsinks
    else:
        alone = np_sparse.sparse_attention_forward(
            given["q"], given["k"], None, indices, return_lse=True, **arguments
        )
        golden["lse_mla"] = np.where(np.isneginf(alone.lse), np.inf, alone.lse)
        golden["max_logits"] = max_logits(given["q"], given["k"], indices, lengths, case)
    return Expected(golden, _baseline(case, dtype, device, seed))


def max_logits(
    q: np.ndarray, k: np.ndarray, indices: np.ndarray, lengths: np.ndarray | None, case: SparseCase
) -> np.ndarray:
    """(S_q, H) the largest scaled score over each query's valid entries, -inf where none is
    (one key head: FlashMLA's)."""
    scale = 1.0 / math.sqrt(case.d) if case.scale is None else case.scale
    valid = (indices >= 0) & (indices < case.s_kv)
    if lengths is not None:
        valid &= np.arange(case.topk)[None, None, :] < lengths[:, None, None]
    rows = np.where(valid, indices, 0)[:, 0]  # (S_q, topk)
    scores = (q @ k[rows, 0].transpose(0, 2, 1)) * q.dtype.type(scale)  # (S_q, H, topk)
    scores = np.where(valid[:, 0][:, None, :], scores, -np.inf)
    return scores.max(axis=-1, initial=-np.inf)


def _baseline(
    case: SparseCase, dtype: str, device: torch.device, seed: int
) -> dict[str, np.ndarray]:
    """The torch twin in the kernel's dtype (its compute dtype float32 for half inputs), its
    gradients by autograd; FlashMLA's forward (float32 sinks) in the twin's compute dtype, out
    rounded to the kernel's dtype."""
    inputs = sparse_inputs(case, dtype, device, seed)
    arguments = {"softmax_scale": case.scale, "topk_length": inputs.get("topk_length"),
                 "d_v": case.dv if case.latent else None}  # fmt: skip
    if case.spec == "flash_mla_sparse":
        return _mla_baseline(case, dtype, inputs, arguments)
    leaves = {name: inputs[name].detach().clone().requires_grad_(True)
              for name in ("q", "k", "v", "sinks") if name in inputs}  # fmt: skip
    out, lse = sparse_attention(leaves["q"], leaves["k"], leaves.get("v"), inputs["indices"],
                                sinks=leaves.get("sinks"), return_lse=True,
                                **arguments)  # fmt: skip
    out.backward(inputs["dout"])
    base = {"out": to64(out), "lse": to64(lse)}
    base.update({GRADIENTS[name]: to64(leaf.grad) for name, leaf in leaves.items()})
    return base


def _mla_baseline(case: SparseCase, dtype: str, inputs: dict, arguments: dict) -> dict:
    compute = torch.float64 if dtype == "float64" else torch.float32
    q, k = inputs["q"].to(compute), inputs["k"].to(compute)
    sinks = inputs.get("sinks")
    sinks = None if sinks is None else sinks.to(compute)
    indices = inputs["indices"]
    with torch.no_grad():
        out = sparse_attention(q, k, None, indices, sinks=sinks, **arguments)
        alone = sparse_attention(q, k, None, indices, return_lse=True, **arguments)
    lse = to64(alone.lse)
    lengths = inputs.get("topk_length")
    plain = np.float64 if dtype == "float64" else np.float32  # the scores in float32
    logits = max_logits(
        to64(q).astype(plain),
        to64(k).astype(plain),
        to64(indices).astype(np.int64),
        None if lengths is None else to64(lengths).astype(np.int64),
        case,
    )
    return {
        "out": to64(out.to(DTYPES[dtype])),
        "lse_mla": np.where(np.isneginf(lse), np.inf, lse),
        "max_logits": logits.astype(np.float64),
    }
