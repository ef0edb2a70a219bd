"""The decode specs' baseline (checker.golden.decode_baseline): flash-attn's semantics computed
plainly, equal to the NumPy reference in float64 (out, lse and the caches it writes), and kept in
the inputs' dtype in half precision (no upcast: that is what makes it a baseline)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.decode.paged import kvcache_attention_forward
from parity_tests.checker.golden.decode import decode_inputs
from parity_tests.checker.golden.decode_baseline import plain_kvcache, plain_mla
from parity_tests.checker.specs import get

from ...conftest import assert_close

KVCACHE = get("flash_kvcache").default_battery()
MLA = get("flash_mla").default_battery()

CPU = torch.device("cpu")
RICH = [KVCACHE[1], next(c for c in KVCACHE if c.rotary == "partial" and c.page_size)]


@pytest.mark.parametrize("case", RICH, ids=lambda c: c.name)
def test_float64_baseline_is_the_numpy_reference(case):
    given = {n: t.clone() for n, t in decode_inputs(case, "float64", CPU, 0).items()}
    arrays = {n: t.numpy().copy() for n, t in given.items()}
    q, k_cache, v_cache = (given.pop(n) for n in ("q", "k_cache", "v_cache"))
    options = {
        "causal": case.causal,
        "window_size": case.window or (-1, -1),
        "softcap": case.softcap,
        "rotary_interleaved": case.rotary == "interleaved",
    }

    out, lse = plain_kvcache(q, k_cache, v_cache, **given, **options, return_softmax_lse=True)
    expected = kvcache_attention_forward(**arrays, **options, return_lse=True)

    assert_close(out, expected.out, name="out")
    finite = np.isfinite(expected.lse)
    assert_close(lse.numpy()[finite], expected.lse[finite], name="lse")
    np.testing.assert_array_equal(k_cache.numpy(), arrays["k_cache"])
    np.testing.assert_array_equal(v_cache.numpy(), arrays["v_cache"])


def test_the_baseline_stays_in_the_inputs_dtype():
    case = MLA[3]
    given = decode_inputs(case, "bfloat16", CPU, 0)

    out, lse = plain_mla(given["q"], given["k_cache"], given["block_table"],
                         given["cache_seqlens"], case.dv, None, None, case.scale,
                         case.causal)  # fmt: skip

    assert out.dtype == lse.dtype == torch.bfloat16
    assert out.shape == (case.batch, case.s_q, case.heads, case.dv)
