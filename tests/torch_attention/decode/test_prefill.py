"""torch_attention.decode.prefill, the torch twin of numpy_attention.decode.prefill: paged_prefill
and cascade_prefill against the NumPy reference in float64 on the mixed batch of its tests
(prefill, chunked prefill, decodes, an empty sequence; shuffled pages, a table wider than needed
with garbage), option by option; float32 by the suite's tolerance; float16 and bfloat16 against
the float64 golden on the same rounded inputs (FLOAT16_RTOL; bfloat16 by the kernel checker's
floor); the twin's refusals are the NumPy twin's messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from numpy_attention.decode.prefill import cascade_prefill_forward, paged_prefill_forward
from parity_tests.tolerances import FLOOR, rel_error
from torch_attention.decode.prefill import cascade_prefill, paged_prefill

from ...conftest import assert_close, to_numpy, to_torch
from ...numpy_attention.decode.test_prefill import Batch, H, make_batch


def _tensors(batch: Batch, dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """The batch's call as tensors: floats in ``dtype``, tables as int64 tensors."""
    return {
        name: to_torch(value).to(dtype) if value.dtype.kind == "f" else to_torch(value)
        for name, value in batch.call().items()
    }


OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window_left": 2},
    "causal window": {"causal": True, "window_left": 0},
    "softcap": {"causal": True, "softcap": 1.5},
    "sinks": {"causal": True, "sinks": np.linspace(-1.0, 1.0, H)},
    "scale": {"softmax_scale": 0.2},
}


def _options(name: str, dtype: torch.dtype = torch.float64) -> tuple[dict, dict]:
    """The option set for NumPy and for torch (sinks as a tensor in ``dtype``)."""
    numpy_options = OPTIONS[name]
    torch_options = dict(numpy_options)
    if "sinks" in numpy_options:
        torch_options["sinks"] = to_torch(numpy_options["sinks"]).to(dtype)
    return numpy_options, torch_options


@pytest.mark.parametrize("option", list(OPTIONS))
def test_matches_the_numpy_reference(rng, option):
    batch = make_batch(rng)
    numpy_options, torch_options = _options(option)
    expected = paged_prefill_forward(**batch.call(), return_lse=True, **numpy_options)

    result = paged_prefill(**_tensors(batch), return_lse=True, **torch_options)

    assert_close(result.out, expected.out, name="out")
    assert_close(result.lse, expected.lse, name="lse")


@pytest.mark.parametrize("option", ["plain", "causal", "sinks", "softcap"])
@pytest.mark.parametrize("prefix_pages", [0, 2])
def test_cascade_matches_the_numpy_reference(rng, option, prefix_pages):
    batch = make_batch(rng, [1, 4, 3, 0], [9, 12, 11, 8], prefix_pages=prefix_pages)
    numpy_options, torch_options = _options(option)
    expected = cascade_prefill_forward(
        **batch.call(), prefix_len=4 * prefix_pages, return_lse=True, **numpy_options
    )

    result = cascade_prefill(
        **_tensors(batch), prefix_len=4 * prefix_pages, return_lse=True, **torch_options
    )

    assert_close(result.out, expected.out, name="out")
    assert_close(result.lse, expected.lse, name="lse")


def test_float32_matches_float64(rng):
    batch = make_batch(rng)
    expected = paged_prefill_forward(**batch.call(), causal=True, return_lse=True)

    result = paged_prefill(**_tensors(batch, torch.float32), causal=True, return_lse=True)

    assert result.out.dtype == torch.float32
    assert_close(result.out, expected.out, dtype=np.float32, name="out")
    assert_close(result.lse, expected.lse, dtype=np.float32, name="lse")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cascade", [False, True])
def test_half_precision_is_computed_in_float32(rng, dtype, cascade):
    batch = make_batch(rng, [1, 4, 3, 0], [9, 12, 11, 8], prefix_pages=2)
    given = _tensors(batch, dtype)
    rounded = {  # the golden's inputs: the half inputs, exactly, in float64
        name: to_numpy(t.double()) if t.is_floating_point() else to_numpy(t)
        for name, t in given.items()
    }
    golden = paged_prefill_forward(**rounded, causal=True, return_lse=True)
    run = cascade_prefill if cascade else paged_prefill
    extra = {"prefix_len": 8} if cascade else {}

    result = run(**given, causal=True, return_lse=True, **extra)

    assert result.out.dtype == dtype and result.lse is not None
    assert result.lse.dtype == torch.float32
    out = to_numpy(result.out.double())
    if dtype == torch.float16:
        assert_close(out, golden.out, dtype=np.float16, name="out")
    else:  # bfloat16 has no NumPy dtype: the kernel checker's floor for it
        assert rel_error(out, golden.out) <= FLOOR["bfloat16"]
    assert_close(to_numpy(result.lse).astype(np.float64), golden.lse, dtype=np.float32, name="lse")


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"kv_lens": np.array([5, 11, 9, 4, 1, 1])}, ValueError, "sequence 5: 2 queries"),
        ({"qo_indptr": [0, 5, 4, 9, 9, 10, 12]}, ValueError, "sequence 1: qo_indptr decreases"),
        ({"block_table": np.zeros((6, 7))}, TypeError, "block_table must be an integer array"),
        ({"prefix_len": 2}, ValueError, "multiple >= 0 of the page size 4"),
    ],
)
def test_refusals_are_the_numpy_twins(rng, change, error, match):
    batch = make_batch(rng)
    given = {**_tensors(batch), **{k: v for k, v in change.items() if k != "prefix_len"}}
    run = cascade_prefill if "prefix_len" in change else paged_prefill
    extra = {"prefix_len": change["prefix_len"]} if "prefix_len" in change else {}
    with pytest.raises(error, match=match):
        run(**given, **extra)
    with pytest.raises(error, match=match):  # the same message from the NumPy twin
        (cascade_prefill_forward if extra else paged_prefill_forward)(
            **{**batch.call(), **{k: v for k, v in change.items() if k != "prefix_len"}}, **extra
        )


def test_refuses_two_dtypes_and_arrays(rng):
    given = _tensors(make_batch(rng))
    with pytest.raises(TypeError, match="inputs must share one dtype"):
        paged_prefill(**{**given, "q": given["q"].float()})
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        paged_prefill(**{**given, "q": to_numpy(given["q"])})
