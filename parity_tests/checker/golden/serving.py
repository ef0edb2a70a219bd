"""The golden and baseline of the serving specs' cases: ``numpy_attention.decode.serving`` in
float64 (FlashInfer's ``flashinfer_paged_forward`` and ``merge_state``/``merge_states``, vLLM's
``vllm_paged_forward``, which writes the new tokens then attends) on the inputs after their cast
to the kernel's dtype, and the torch twin (``torch_attention.decode.serving``) in that dtype as
the plain baseline the bounds scale (its compute dtype float32 for half inputs).

The tensors, by the real APIs' conventions: q, the pools, key and value in the kernel's dtype;
FlashInfer's CSR arrays (``qo_indptr``, ``paged_kv_indptr``, ``paged_kv_indices`` with spare
entries past the last sequence's, ``paged_kv_last_page_len``) int32; vLLM's ``query_start_loc``,
``seq_lens`` and ``block_table`` int32 and ``slot_mapping`` int64; sinks and a merge's s float32.
The golden's lse is FlashInfer's, base 2.

Shape legend: B sequences, T query tokens, H query heads, H_kv key/value heads, D head width,
P page size, S states of a merge.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import torch

from numpy_attention.decode import serving as np_serving
from torch_attention.decode import serving as torch_serving

from ..battery.serving import MergeCase, PagedCase, make_merge_inputs, make_paged_inputs
from . import DTYPES, to64

FLOAT32_INPUTS = ("sinks", "s")


def csr(table: np.ndarray, kv_lens: np.ndarray, page: int) -> dict[str, np.ndarray]:
    """FlashInfer's CSR page table of a block table: indptr (B + 1,), the pages each sequence
    needs in order then the table's spare entries (a buffer longer than indptr says), and the
    tokens of each sequence's last page."""
    needed = -(-kv_lens // page)
    indices = [table[b, :n] for b, n in enumerate(needed)] + [table[:, -1]]
    last = np.where(needed > 0, kv_lens - (needed - 1) * page, 0)
    return {
        "paged_kv_indptr": np.concatenate([[0], np.cumsum(needed)]),
        "paged_kv_indices": np.concatenate(indices),
        "paged_kv_last_page_len": last,
    }


def _arrays(case: PagedCase | MergeCase, seed: int) -> dict[str, np.ndarray]:
    """The case's inputs by their API names (None left out)."""
    if isinstance(case, MergeCase):
        return dict(make_merge_inputs(case, seed)._asdict())
    drawn = {k: v for k, v in make_paged_inputs(case, seed)._asdict().items() if v is not None}
    if case.spec == "flashinfer_paged":
        drawn.update(csr(drawn.pop("block_table"), drawn.pop("kv_lens"), case.page_size))
        drawn["qo_indptr"] = drawn.pop("qo_indptr")
        for name in ("key", "value", "slot_mapping"):
            drawn.pop(name, None)
    else:
        drawn["query_start_loc"] = drawn.pop("qo_indptr")
        drawn["seq_lens"] = drawn.pop("kv_lens")
    return drawn


@functools.lru_cache(maxsize=512)
def serving_inputs(
    case: PagedCase | MergeCase, dtype: str, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """The arguments of a case as tensors (see the module docstring); shared by every kernel
    checked, which only ever gets copies."""
    tensors = {}
    for name, array in _arrays(case, seed).items():
        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
        if array.dtype.kind in "iu":
            tensor = tensor.to(torch.int64 if name == "slot_mapping" else torch.int32)
        elif name in FLOAT32_INPUTS:
            tensor = tensor.to(torch.float32)
        else:
            tensor = tensor.to(DTYPES[dtype])
        tensors[name] = tensor
    return tensors


class Expected(NamedTuple):
    """Golden and baseline of a case: dicts of float64 arrays by result name."""

    golden: dict[str, np.ndarray]
    baseline: dict[str, np.ndarray]


@functools.lru_cache(maxsize=512)
def serving_expected(
    case: PagedCase | MergeCase, dtype: str, device: torch.device, seed: int
) -> Expected:
    """The golden and the baseline of a case (cached)."""
    inputs = serving_inputs(case, dtype, device, seed)
    given = {name: (to64(t) if t.is_floating_point() else t.cpu().numpy())
             for name, t in inputs.items()}  # integers keep their dtype: the APIs check it
    copies = {name: t.clone() for name, t in inputs.items()}
    if isinstance(case, MergeCase):
        golden = _merge(np_serving, given, case)
        base = _merge(torch_serving, copies, case)
    elif case.spec == "flashinfer_paged":
        golden = _flashinfer(np_serving.flashinfer_paged_forward, given, case)
        base = _flashinfer(torch_serving.flashinfer_paged, copies, case)
    else:
        golden = _vllm(np_serving.vllm_paged_forward, given, case)
        base = _vllm(torch_serving.vllm_paged, copies, case)
    return Expected(golden, {name: _as64(value) for name, value in base.items()})


def _as64(value: Any) -> np.ndarray:
    return to64(value) if isinstance(value, torch.Tensor) else np.asarray(value, np.float64)


def paged_options(case: PagedCase) -> dict[str, Any]:
    """The options every paged API names alike (the specs rename them)."""
    return {"causal": case.causal, "window_left": case.window, "softcap": case.softcap}


def _flashinfer(function: Any, given: dict, case: PagedCase) -> dict[str, Any]:
    options = paged_options(case)
    out, lse = function(
        given["q"], (given["k_pages"], given["v_pages"]), qo_indptr=given["qo_indptr"],
        paged_kv_indptr=given["paged_kv_indptr"], paged_kv_indices=given["paged_kv_indices"],
        paged_kv_last_page_len=given["paged_kv_last_page_len"], kv_layout="NHD",
        causal=options["causal"], window_left=options["window_left"],
        logits_soft_cap=options["softcap"], sinks=given.get("sinks"), return_lse=True,
    )  # fmt: skip
    return {"out": out, "lse": lse}


def _vllm(function: Any, given: dict, case: PagedCase) -> dict[str, Any]:
    if isinstance(given["k_pages"], torch.Tensor):
        kv_cache = torch.stack([given["k_pages"], given["v_pages"]])
    else:
        kv_cache = np.stack([given["k_pages"], given["v_pages"]])
    out = function(
        given["q"], given["key"], given["value"], kv_cache,
        query_start_loc=given["query_start_loc"], seq_lens=given["seq_lens"],
        block_table=given["block_table"], slot_mapping=given["slot_mapping"],
        sinks=given.get("sinks"), common_prefix_len=case.prefix, **paged_options(case),
    )  # fmt: skip
    return {"out": out, "kv_cache": kv_cache}


def _merge(module: Any, given: dict, case: MergeCase) -> dict[str, Any]:
    v, s = given["v"], given["s"]
    if case.states == 2:
        out, lse = module.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    else:
        out, lse = module.merge_states(v, s)
    return {"v": out, "s": lse}
