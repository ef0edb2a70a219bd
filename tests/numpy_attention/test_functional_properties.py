"""Random combinations of today's options (hypothesis, derandomized): the dense path against the
torch-autograd oracle, and the tiled path against the dense one, forward and backward, in
float64; a second backward from the same ctx gives the same gradients. A few hundred examples run
in the suite; more on request:

    ATTENTION_FUZZ_EXAMPLES=5000 python -m pytest \
        tests/numpy_attention/test_functional_properties.py
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numpy_attention import tiled
from numpy_attention.functional import attention_backward, attention_forward

from ..conftest import assert_close
from . import oracle

EXAMPLES = int(os.environ.get("ATTENTION_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def calls(draw):
    """Inputs and options of one call: shapes (with empty and length-1 sequences), GQA, every
    score rule, masks (with dead rows), dropout with an explicit keep-mask."""
    batch, kv_heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2]))
    heads = kv_heads * group
    n, m = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    d, dv = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    arrays = {
        "q": rng.standard_normal((batch, heads, n, d)) * draw(st.sampled_from([0.5, 2.0])),
        "k": rng.standard_normal((batch, kv_heads, m, d)),
        "v": rng.standard_normal((batch, kv_heads, m, dv)),
    }
    side = st.one_of(st.none(), st.integers(0, 4))
    options = {
        "enable_gqa": group > 1,
        "causal": draw(st.booleans()),
        "window": draw(st.one_of(st.none(), st.tuples(side, side))),
        "align": draw(st.sampled_from(["top-left", "bottom-right"])),
        "softcap": draw(st.sampled_from([0.0, 0.7, 4.0])),
        "scale": draw(st.sampled_from([None, 0.3])),
    }
    slopes = draw(st.sampled_from(["none", "H", "BH"]))
    if slopes != "none":
        options["alibi_slopes"] = rng.random((heads,) if slopes == "H" else (batch, heads))
    if draw(st.booleans()):
        arrays["sinks"] = rng.standard_normal(heads)
    if draw(st.booleans()):
        options["key_padding_mask"] = rng.random((batch, m)) < 0.3
    mask = draw(st.sampled_from(["none", "bool", "float"]))
    if mask == "bool":
        options["attn_mask"] = rng.random((n, m)) < 0.7
    elif mask == "float":
        options["attn_mask"] = np.where(
            rng.random((heads, n, m)) < 0.2, -np.inf, rng.random((heads, n, m))
        )
    if draw(st.booleans()):
        options.update(dropout_p=0.2, dropout_mask=rng.random((batch, heads, n, m)) > 0.2)
    upstream = (rng.standard_normal((batch, heads, n, dv)), rng.standard_normal((batch, heads, n)))
    blocks = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    return arrays, options, upstream, blocks


def run(arrays, options, upstream, forward, **extra):
    result = forward(
        arrays["q"], arrays["k"], arrays["v"], sinks=arrays.get("sinks"), return_lse=True,
        **options, **extra,
    )  # fmt: skip
    grads = attention_backward(*upstream[:1], result.ctx, upstream[1])
    again = attention_backward(*upstream[:1], result.ctx, upstream[1])
    for first, second in zip(grads, again, strict=True):  # the ctx is not consumed
        np.testing.assert_array_equal(first, second)
    values = {"out": result.out, "lse": result.lse, "dq": grads.dq, "dk": grads.dk}
    values["dv"] = grads.dv
    if grads.dsinks is not None:
        values["dsinks"] = grads.dsinks
    return values


def assert_same(actual, expected):
    assert set(actual) == set(expected)
    for name, value in expected.items():
        finite = np.isfinite(value)
        np.testing.assert_array_equal(np.isfinite(actual[name]), finite, err_msg=name)
        np.testing.assert_array_equal(actual[name][~finite], value[~finite], err_msg=name)
        assert_close(np.where(finite, actual[name], 0), np.where(finite, value, 0), name=name)


@FUZZ
@given(calls())
def test_dense_matches_the_torch_oracle(call):
    arrays, options, upstream, _ = call

    actual = run(arrays, options, upstream, attention_forward, impl="dense")
    expected = oracle.attention_and_grads(arrays, *upstream, **options)

    assert_same(actual, expected)


@FUZZ
@given(calls())
def test_tiled_matches_dense(call):
    arrays, options, upstream, (block_q, block_k) = call

    actual = run(
        arrays, options, upstream, tiled.tiled_attention_forward, block_q=block_q, block_k=block_k
    )
    expected = run(arrays, options, upstream, attention_forward, impl="dense")

    assert_same(actual, expected)
