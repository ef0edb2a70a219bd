"""torch_attention.decode.serving, the torch twin of numpy_attention.decode.serving: every
function against the NumPy twin in float64 (FlashInfer's CSR table, its paged prefill in every
layout, its merge operators; vLLM's step: out, lse and the cache after it, with a padding token
and a common prefix), half precision by the suite's policy, and ``PagedPrefillWrapper``'s
plan/run against the one-call ``flashinfer_paged``; refusals leave the cache untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from numpy_attention.decode.serving import (
    csr_block_table as csr_block_table_np,
)
from numpy_attention.decode.serving import (
    flashinfer_paged_forward,
    vllm_paged_forward,
)
from numpy_attention.decode.serving import merge_state as merge_state_np
from numpy_attention.decode.serving import (
    merge_states as merge_states_np,
)
from parity_tests.tolerances import FLOOR, rel_error
from torch_attention.decode.serving import (
    PagedPrefillWrapper,
    csr_block_table,
    flashinfer_paged,
    merge_state,
    merge_states,
    vllm_paged,
)

from ...conftest import assert_close, to_numpy, to_torch
from ...numpy_attention.decode.test_prefill import H_KV, D, H, P, make_batch
from ...numpy_attention.decode.test_serving import _layouts, csr, vllm_step


def _torch(value: Any, dtype: torch.dtype = torch.float64) -> Any:
    """Arrays (and tuples of them) as tensors, floats in ``dtype``, integers as they are."""
    if isinstance(value, tuple):
        return tuple(_torch(v, dtype) for v in value)
    if isinstance(value, np.ndarray):
        tensor = to_torch(value)
        return tensor.to(dtype) if tensor.is_floating_point() else tensor
    return value


def test_csr_block_table_matches_numpy():
    arrays = (np.array([0, 2, 2, 5], np.int32), np.array([7, 3, 0, 1, 4], np.int32),
              np.array([1, 0, 4], np.int32))  # fmt: skip

    table, lens = csr_block_table(*map(to_torch, arrays), page_size=4, num_pages=8)

    expected = csr_block_table_np(*arrays, page_size=4, num_pages=8)
    np.testing.assert_array_equal(to_numpy(table), expected[0])
    np.testing.assert_array_equal(to_numpy(lens), expected[1])
    assert table.dtype == torch.int64


def test_csr_refuses_int64_like_numpy():
    arrays = [torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([1])]
    with pytest.raises(TypeError, match="paged_kv_indptr must be int32.*torch.int64.*#725"):
        csr_block_table(*arrays, page_size=4, num_pages=1)


@pytest.mark.parametrize("layout", ["NHD pair", "HND pair", "NHD 5-D", "HND 5-D"])
def test_flashinfer_layouts_match_numpy(rng, layout):
    batch = make_batch(rng)
    batch = batch._replace(v_pages=rng.standard_normal(batch.k_pages.shape))
    cache, kv_layout = _layouts(batch)[layout]
    metadata = {"qo_indptr": batch.qo_indptr.astype(np.int32), **csr(batch)}
    sinks = np.linspace(-1.0, 1.0, H)
    expected = flashinfer_paged_forward(
        batch.q, cache, **metadata, kv_layout=kv_layout, causal=True, window_left=4,
        logits_soft_cap=2.0, sinks=sinks, return_lse=True,
    )  # fmt: skip

    out, lse = flashinfer_paged(
        _torch(batch.q), _torch(cache), **{k: to_torch(v) for k, v in metadata.items()},
        kv_layout=kv_layout, causal=True, window_left=4, logits_soft_cap=2.0,
        sinks=to_torch(sinks), return_lse=True,
    )  # fmt: skip

    assert_close(out, expected[0], name="out")
    assert_close(lse, expected[1], name="lse (base 2)")


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_wrapper_plan_then_run_is_the_one_call(rng, kv_layout):
    batch = make_batch(rng)
    cache = _torch(_layouts(batch)[f"{kv_layout} pair"][0])
    metadata = {"qo_indptr": batch.qo_indptr.astype(np.int32), **csr(batch)}
    metadata = {k: to_torch(v) for k, v in metadata.items()}
    expected = flashinfer_paged(
        _torch(batch.q), cache, **metadata, kv_layout=kv_layout, causal=True, window_left=3,
        return_lse=True,
    )  # fmt: skip
    wrapper = PagedPrefillWrapper(torch.empty(8, dtype=torch.uint8), kv_layout=kv_layout)

    wrapper.plan(
        *metadata.values(), num_qo_heads=H, num_kv_heads=H_KV, head_dim_qk=D, page_size=P,
        causal=True, window_left=3, head_dim_vo=batch.v_pages.shape[-1],
        q_data_type=torch.float64, kv_data_type="float64",
    )  # fmt: skip
    out, lse = wrapper.run(_torch(batch.q), cache, return_lse=True)

    torch.testing.assert_close(out, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, expected[1], rtol=0, atol=0)


def test_wrapper_refusals(rng):
    batch = make_batch(rng)
    cache = _torch((batch.k_pages, batch.v_pages))
    arrays = [batch.qo_indptr.astype(np.int32), *csr(batch).values()]
    metadata = [to_torch(v) for v in arrays]
    wrapper = PagedPrefillWrapper()
    with pytest.raises(RuntimeError, match="needs plan"):
        wrapper.run(_torch(batch.q), cache)
    with pytest.raises(ValueError, match="num_qo_heads 4 must be a multiple of num_kv_heads 3"):
        wrapper.plan(*metadata, num_qo_heads=4, num_kv_heads=3, head_dim_qk=D, page_size=P)
    with pytest.raises(TypeError, match="qo_indptr must be int32"):
        wrapper.plan(metadata[0].long(), *metadata[1:], H, H_KV, D, P)
    with pytest.raises(ValueError, match="kv_layout must be"):
        PagedPrefillWrapper(kv_layout="NDH")
    wrapper.plan(*metadata, num_qo_heads=H, num_kv_heads=H_KV, head_dim_qk=D, page_size=2 * P)
    with pytest.raises(ValueError, match="were planned"):
        wrapper.run(_torch(batch.q), cache)


def test_merge_state_and_states_match_numpy(rng):
    v = rng.standard_normal((3, 4, H, 5))
    s = rng.standard_normal((3, 4, H)) * 3
    s[0, 1] = -np.inf
    s[2] = -np.inf  # a row dead in every state

    pair = merge_state(*map(to_torch, (v[:, 0], s[:, 0], v[:, 1], s[:, 1])))
    every = merge_states(to_torch(v), to_torch(s))

    for got, want in ((pair, merge_state_np(v[:, 0], s[:, 0], v[:, 1], s[:, 1])),
                      (every, merge_states_np(v, s))):  # fmt: skip
        assert_close(got[0], want[0], name="v")
        np.testing.assert_array_equal(np.isneginf(to_numpy(got[1])), np.isneginf(want[1]))
        finite = np.isfinite(want[1])
        assert_close(to_numpy(got[1])[finite], want[1][finite], name="s")
    np.testing.assert_array_equal(to_numpy(every[0][2]), 0.0)


@pytest.mark.parametrize("prefix", [0, 8])
def test_vllm_matches_numpy_and_writes_the_same_cache(rng, prefix):
    call = vllm_step(rng, (1, 3, 2), (10, 11, 10), prefix_pages=2)
    sinks = np.linspace(-1.0, 1.0, H)
    given = {name: _torch(value) for name, value in call.items()}
    given["kv_cache"] = to_torch(call["kv_cache"].copy())
    end = call["query_start_loc"][-1]
    expected = vllm_paged_forward(**call, common_prefix_len=prefix, sinks=sinks, return_lse=True)

    out, lse = vllm_paged(**given, common_prefix_len=prefix, sinks=to_torch(sinks), return_lse=True)

    np.testing.assert_array_equal(to_numpy(given["kv_cache"]), call["kv_cache"])
    assert_close(out, expected[0], name="out")
    assert_close(lse[:end], expected[1][:end], name="lse")
    assert torch.isneginf(lse[end:]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_vllm_half_precision(rng, dtype):
    call = vllm_step(rng)
    given = {name: _torch(value, dtype) for name, value in call.items()}
    golden_call = {  # the half inputs, exactly, in float64
        name: to_numpy(t.double()) if t.is_floating_point() else to_numpy(t)
        for name, t in given.items()
    }
    expected = vllm_paged_forward(**golden_call)

    out = vllm_paged(**given)

    assert out.dtype == dtype
    error = rel_error(to_numpy(out.double()), expected)
    assert error <= (1e-3 if dtype == torch.float16 else FLOOR["bfloat16"])
    written = to_numpy(given["kv_cache"].double())
    np.testing.assert_array_equal(written, golden_call["kv_cache"])


@pytest.mark.parametrize(
    ("name", "match"),
    [("slot_mapping", "tokens 2 and 5 both write slot"), ("block_table", "null block")],
)
def test_vllm_refusals_write_nothing(rng, name, match):
    call = vllm_step(rng)
    if name == "slot_mapping":
        call["slot_mapping"][5] = call["slot_mapping"][2]
    else:
        call["block_table"][1, 2] = 0
    given = {key: _torch(value) for key, value in call.items()}
    before = given["kv_cache"].clone()

    with pytest.raises(ValueError, match=match):
        vllm_paged(**given)

    torch.testing.assert_close(given["kv_cache"], before, rtol=0, atol=0)
