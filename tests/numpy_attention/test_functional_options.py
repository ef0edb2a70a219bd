"""Today's options of the NumPy core (GQA, windows, alignment, softcap, ALiBi, sinks, lse) and
the edge rules, on the dense path: against the torch-autograd oracle (tests/numpy_attention/
oracle.py) in float64 and float32, by finite differences, and on bad input.

The tiled path is held to the dense one in test_tiled.py; random combinations of options are in
test_functional_properties.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.functional import attention, attention_backward, attention_forward
from numpy_attention.gradcheck import gradcheck

from ..conftest import assert_close, assert_gradcheck
from . import oracle
from .cases import LENGTHS, OPTIONS, make_case


def numpy_side(arrays, kwargs, dout, dlse, dtype=np.float64):
    cast = {name: a.astype(dtype) for name, a in arrays.items()}
    result = attention_forward(
        cast["q"], cast["k"], cast["v"], sinks=cast.get("sinks"), return_lse=True, **kwargs
    )
    grads = attention_backward(dout.astype(dtype), result.ctx, dlse.astype(dtype))
    values = {"out": result.out, "lse": result.lse, "dq": grads.dq, "dk": grads.dk, "dv": grads.dv}
    if grads.dsinks is not None:
        values["dsinks"] = grads.dsinks
    return values


def compare(actual, expected, dtype=None):
    assert set(actual) == set(expected)
    for name, value in expected.items():
        finite = np.isfinite(value)
        np.testing.assert_array_equal(np.isfinite(actual[name]), finite, err_msg=name)
        np.testing.assert_array_equal(actual[name][~finite], value[~finite], err_msg=name)
        assert_close(
            np.where(finite, actual[name], 0), np.where(finite, value, 0), dtype=dtype, name=name
        )


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("name", OPTIONS)
def test_matches_the_torch_oracle_in_float64(rng, name, lengths):
    arrays, kwargs, dout, dlse = make_case(rng, name, lengths)

    actual = numpy_side(arrays, kwargs, dout, dlse)
    expected = oracle.attention_and_grads(arrays, dout, dlse, **kwargs)

    compare(actual, expected)


@pytest.mark.parametrize("name", OPTIONS)
def test_float32_is_accurate_to_float32_rounding(rng, name):
    arrays, kwargs, dout, dlse = make_case(rng, name, "N9-M5", d=16, dv=8)
    rounded = {key: a.astype(np.float32).astype(np.float64) for key, a in arrays.items()}

    actual = numpy_side(arrays, kwargs, dout, dlse, dtype=np.float32)
    douts = (t.astype(np.float32).astype(np.float64) for t in (dout, dlse))
    expected = oracle.attention_and_grads(rounded, *douts, **kwargs)

    assert all(value.dtype == np.float32 for value in actual.values())
    compare(actual, expected, dtype=np.float32)


@pytest.mark.parametrize("name", OPTIONS)
def test_gradcheck_of_out_and_lse(rng, name):
    arrays, kwargs, _, _ = make_case(rng, name, "N5-M9", batch=1)
    names = list(arrays)

    def forward(*tensors):
        given = dict(zip(names, tensors, strict=True))
        result = attention_forward(
            given["q"], given["k"], given["v"], sinks=given.get("sinks"), return_lse=True, **kwargs
        )
        lse = np.where(np.isfinite(result.lse), result.lse, 0.0)  # dead rows: lse -inf, constant
        return np.concatenate([result.out, lse[..., None]], axis=-1), result.ctx

    def backward(dcombined, ctx):
        return attention_backward(dcombined[..., :-1], ctx, dcombined[..., -1])

    assert_gradcheck(gradcheck(forward, *arrays.values(), backward=backward))


# -- semantics that the options must get exactly right ---------------------------------------


def test_bottom_right_causal_lets_a_decode_step_see_the_whole_cache(rng):
    q, k, v = (
        rng.standard_normal((1, 1, 1, 4)),
        rng.standard_normal((1, 1, 9, 4)),
        rng.standard_normal((1, 1, 9, 3)),
    )

    decode = attention(q, k, v, causal=True, align="bottom-right")
    top_left = attention(q, k, v, causal=True)

    assert_close(decode, attention(q, k, v), name="decode sees all 9 keys")
    assert_close(top_left, v[..., :1, :], name="top-left sees key 0 only")


def test_bottom_right_rows_before_the_first_key_see_nothing(rng):
    q, k, v = (rng.standard_normal((1, 2, length, 3)) for length in (6, 4, 4))

    result = attention_forward(q, k, v, causal=True, align="bottom-right", return_lse=True)

    assert np.all(result.out[..., :2, :] == 0) and np.all(np.isneginf(result.lse[..., :2]))
    assert np.all(np.isfinite(result.lse[..., 2:]))


def test_window_counts_the_query_itself(rng):
    q, k, v = (rng.standard_normal((1, 1, 8, 3)) for _ in range(3))

    probs = attention_forward(q, k, v, window=(2, 0)).ctx.probs[0]

    visible = probs > 0
    expected = np.array([[0 <= i - j <= 2 for j in range(8)] for i in range(8)])
    np.testing.assert_array_equal(visible, expected)


def test_gqa_reads_kv_head_h_over_group(rng):
    q = rng.standard_normal((1, 4, 3, 5))
    k, v = rng.standard_normal((1, 2, 6, 5)), rng.standard_normal((1, 2, 6, 2))

    grouped = attention(q, k, v, enable_gqa=True)
    repeated = attention(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1))

    assert_close(grouped, repeated, name="h // group")


def test_sinks_take_weight_from_every_row(rng):
    q, k, v = (rng.standard_normal((1, 2, 5, 3)) for _ in range(3))

    plain = attention_forward(q, k, v, return_lse=True)
    sunk = attention_forward(q, k, v, sinks=np.array([0.3, -2.0]), return_lse=True)

    sink_weight = np.exp(np.array([0.3, -2.0])[:, None] - sunk.lse[0])  # (H, N)
    assert_close(sunk.out, plain.out * (1 - sink_weight)[None, ..., None], name="out")
    assert_close(sunk.lse, np.logaddexp(plain.lse, np.array([0.3, -2.0])[:, None]), name="lse")


# -- edge rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_no_keys_give_zero_output_and_minus_inf_lse(rng, impl):
    q, k, v = rng.standard_normal((1, 2, 3, 4)), np.ones((1, 2, 0, 4)), np.ones((1, 2, 0, 5))

    result = attention_forward(q, k, v, impl=impl, return_lse=True)
    grads = attention_backward(rng.standard_normal(result.out.shape), result.ctx)

    assert result.out.shape == (1, 2, 3, 5) and np.all(result.out == 0)
    assert np.all(np.isneginf(result.lse))
    assert (
        np.all(grads.dq == 0) and grads.dk.shape == (1, 2, 0, 4) and grads.dv.shape == (1, 2, 0, 5)
    )


@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_no_keys_with_sinks_give_lse_of_the_sink(rng, impl):
    q, k, v = rng.standard_normal((1, 2, 3, 4)), np.ones((1, 2, 0, 4)), np.ones((1, 2, 0, 5))
    sinks = np.array([0.5, -1.0])

    result = attention_forward(q, k, v, sinks=sinks, impl=impl, return_lse=True)
    grads = attention_backward(np.ones(result.out.shape), result.ctx, np.ones(result.lse.shape))

    assert np.all(result.out == 0)
    np.testing.assert_array_equal(result.lse, np.broadcast_to(sinks[:, None], (1, 2, 3)))
    np.testing.assert_array_equal(grads.dsinks, [3.0, 3.0])  # d lse / d sink = 1, three rows


@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_no_queries_give_empty_results(rng, impl):
    q, k, v = np.ones((2, 0, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))

    result = attention_forward(q, k, v, impl=impl, return_lse=True)
    grads = attention_backward(np.ones((2, 0, 3)), result.ctx)

    assert result.out.shape == (2, 0, 3) and result.lse.shape == (2, 0)
    assert np.all(grads.dk == 0) and np.all(grads.dv == 0)


HIDERS = {
    "causal": lambda m: {"causal": True},
    "window": lambda m: {"window": (1, 0)},
    "padding": lambda m: {"key_padding_mask": np.arange(m)[None, :].repeat(2, 0) == m - 1},
    "bool-mask": lambda m: {"attn_mask": np.arange(m)[None, :] != m - 1},
    "float-mask": lambda m: {"attn_mask": np.where(np.arange(m)[None, :] == m - 1, -np.inf, 0.5)},
}


# NumPy warns about the NaN and inf it computes with (a product with a NaN key); that is its
# business, not these tests'.
NON_FINITE = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@NON_FINITE
@pytest.mark.parametrize("impl", ["dense", "tiled"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("hider", HIDERS)
def test_a_non_finite_hidden_key_never_leaks(rng, impl, bad, hider):
    """The last key holds NaN or inf and is hidden from every query but (causal, window) the
    last: its score is replaced by -inf, so no other row changes."""
    n = m = 6
    q, k, v = (rng.standard_normal((2, 2, length, 3)) for length in (n, m, m))
    kwargs = HIDERS[hider](m)
    clean = attention(q, k, v, impl=impl, **kwargs)
    k[..., -1, :] = bad

    out = attention(q, k, v, impl=impl, **kwargs)

    seen_by_last = hider in ("causal", "window")
    np.testing.assert_array_equal(out[..., : n - 1, :], clean[..., : n - 1, :])
    if not seen_by_last:
        np.testing.assert_array_equal(out, clean)


@NON_FINITE
@pytest.mark.parametrize("impl", ["dense", "tiled"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_garbage_in_padding_is_never_read(rng, impl, bad):
    """K and V rows that every query hides (key padding) are not multiplied by zeros but never
    read: an unwritten slot leaves every output and gradient finite, on both paths."""
    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    padding = np.zeros((2, 6), dtype=bool)
    padding[0, 4:] = True
    clean = attention_forward(q, k, v, key_padding_mask=padding, impl=impl)
    k[0, :, 4:], v[0, :, 4:] = bad, bad

    result = attention_forward(q, k, v, key_padding_mask=padding, impl=impl)
    grads = attention_backward(np.ones(result.out.shape), result.ctx)

    np.testing.assert_array_equal(result.out, clean.out)
    assert all(np.isfinite(grad).all() for grad in grads[:3])
    assert np.all(grads.dk[0, :, 4:] == 0) and np.all(grads.dv[0, :, 4:] == 0)


@NON_FINITE
@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_nan_reaches_exactly_the_rows_that_see_it(rng, impl):
    q, k, v = (rng.standard_normal((1, 1, 6, 3)) for _ in range(3))
    q[0, 0, 2, 1] = np.nan  # query row 2
    k[0, 0, 4, 0] = np.nan  # key 4: seen by rows 4 and 5 under causal

    out = attention(q, k, v, causal=True, impl=impl)

    np.testing.assert_array_equal(np.isnan(out).any(axis=-1)[0, 0], [0, 0, 1, 0, 1, 1])


@NON_FINITE
@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_a_visible_inf_score_makes_its_row_nan(rng, impl):
    q, k, v = (rng.standard_normal((1, 1, 4, 3)) for _ in range(3))
    k[0, 0, 1] = np.inf

    out = attention(q, k, v, causal=True, impl=impl)

    np.testing.assert_array_equal(np.isnan(out).any(axis=-1)[0, 0], [0, 1, 1, 1])


# -- bad input -------------------------------------------------------------------------------------


QKV = (np.ones((1, 4, 3, 2)), np.ones((1, 4, 5, 2)), np.ones((1, 4, 5, 2)))
BAD = [
    ({"scale": np.nan}, ValueError, "scale must be finite"),
    ({"scale": np.inf}, ValueError, "scale must be finite"),
    ({"scale": "1"}, TypeError, "scale must be a real number"),
    ({"causal": "no"}, TypeError, "causal must be a bool"),
    ({"causal": 1}, TypeError, "causal must be a bool"),
    ({"enable_gqa": 1}, TypeError, "enable_gqa must be a bool"),
    ({"window": (-1, 2)}, ValueError, r"window\[0\] must be a non-negative int"),
    ({"window": (2, -3)}, ValueError, r"window\[1\] must be a non-negative int"),
    ({"window": 3}, TypeError, r"window must be \(left, right\)"),
    ({"window": (1.5, 2)}, TypeError, r"window\[0\] must be an int"),
    ({"align": "bottom"}, ValueError, "align must be one of"),
    ({"softcap": -1.0}, ValueError, "softcap must be >= 0"),
    ({"softcap": np.nan}, ValueError, "softcap must be finite"),
    ({"alibi_slopes": np.ones(3)}, ValueError, r"alibi_slopes must be \(H,\) or \(B, H\)"),
    ({"alibi_slopes": np.ones((2, 4))}, ValueError, r"alibi_slopes \(B, H\) = \(2, 4\)"),
    ({"alibi_slopes": np.ones(4, dtype=int)}, TypeError, "alibi_slopes must be a floating"),
    ({"alibi_slopes": np.array([0.5, np.nan, 1, 2])}, ValueError, "alibi_slopes must be finite"),
    ({"sinks": np.ones(3)}, ValueError, r"sinks must be \(H,\)"),
    ({"sinks": np.ones(4, dtype=np.float32)}, TypeError, "sinks must have the dtype"),
    ({"sinks": np.array([0.0, -np.inf, 1.0, 2.0])}, ValueError, "sinks must be finite"),
    ({"attn_mask": (np.ones((3, 5), bool), np.ones((3, 5)))}, TypeError, "attn_mask must be one"),
    (
        {"dropout_p": 0.1, "dropout_mask": np.ones((3, 5), int)},
        TypeError,
        "dropout_mask must be a bool",
    ),
    ({"chunk_size": 0}, ValueError, "chunk_size must be a positive int"),
    ({"chunk_size": 2.0}, TypeError, "chunk_size must be an int"),
    ({"chunk_start": 1}, ValueError, "chunk_start is given without chunk_size"),
    ({"chunk_size": 2, "chunk_start": 0.5}, TypeError, "chunk_start must be an int"),
    ({"chunk_size": 2, "chunk_start": np.zeros(3, int)}, ValueError, r"chunk_start must be an"),
    ({"impl": "fast"}, ValueError, "impl must be one of"),
    ({"return_lse": "yes"}, TypeError, "return_lse must be a bool"),
]


@pytest.mark.parametrize("impl", ["dense", "tiled"])
@pytest.mark.parametrize(("kwargs", "error", "match"), BAD)
def test_bad_options_are_refused_before_any_work(kwargs, error, match, impl):
    kwargs = {"impl": impl, **kwargs}

    with pytest.raises(error, match=match):
        attention_forward(*QKV, **kwargs)


def qkv(q_shape, k_shape, v_shape):
    return tuple(np.ones(shape) for shape in (q_shape, k_shape, v_shape))


MHA, GQA = (1, 4, 3, 2), {"enable_gqa": True}
BAD_SHAPES = [
    (qkv(MHA, (1, 2, 5, 2), (1, 2, 5, 2)), {}, "need enable_gqa=True"),
    (
        qkv(MHA, (1, 3, 5, 2), (1, 3, 5, 2)),
        GQA,
        "H = 4 must be a multiple of the kv heads H_kv = 3",
    ),
    (qkv((2, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 2)), GQA, "differ only in the heads axis"),
    (qkv(MHA, (1, 4, 5, 2), (1, 4, 6, 2)), {}, "k and v must share"),
    (qkv((1, 1, 3, 0), (1, 1, 5, 0), (1, 1, 5, 2)), {}, "D = 0"),
    (qkv((1, 1, 3, 0), (1, 1, 5, 0), (1, 1, 5, 2)), {"scale": 1.0}, "D = 0"),
]


@pytest.mark.parametrize("impl", ["dense", "tiled"])
@pytest.mark.parametrize(("qkv", "kwargs", "match"), BAD_SHAPES)
def test_bad_shapes_are_refused_naming_them(qkv, kwargs, match, impl):
    with pytest.raises(ValueError, match=match):
        attention_forward(*qkv, impl=impl, **kwargs)


def test_backward_checks_dlse(rng):
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    ctx = attention_forward(q, k, v).ctx

    with pytest.raises(ValueError, match=r"dlse must have the output's shape \(1, 2, 3\)"):
        attention_backward(np.ones((1, 2, 3, 4)), ctx, np.ones((1, 2, 4)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_weights_too_small_for_a_product_are_exact_zeros(rng, dtype):
    """Steep ALiBi puts most weights below exp(floor) (about 1e-31 in float32): the dense path
    makes them exact zeros, so no product meets a denormal, and the results are those of the
    oracle, which keeps them, to the dtype's rounding."""
    arrays, _, dout, dlse = make_case(rng, "alibi-H", "N9-M5", d=16, dv=8)
    slopes = np.array([230.0, 30.0, 8.0, 0.5])  # weights near exp(-690) and exp(-90): both kept
    # by exp (float64, float32), both below the floor (-672, -71.4)
    kwargs = {"alibi_slopes": slopes.astype(dtype)}
    rounded = {key: a.astype(dtype).astype(np.float64) for key, a in arrays.items()}
    q, k, v = (arrays[key].astype(dtype) for key in "qkv")

    probs = attention_forward(q, k, v, impl="dense", **kwargs).ctx.probs
    actual = numpy_side(arrays, kwargs, dout, dlse, dtype=dtype)
    douts = (t.astype(dtype).astype(np.float64) for t in (dout, dlse))
    expected = oracle.attention_and_grads(rounded, *douts, alibi_slopes=slopes)

    info = np.finfo(dtype)
    assert np.all((probs == 0) | (probs >= info.tiny / info.eps))
    compare(actual, expected, dtype=dtype)
