"""Packed variable-length attention (numpy_attention.varlen) in flash-attn's layout.

Two oracles: ``attention_forward`` on each unpadded sequence, (H, n_s, D) at a time; and one dense
attention over the whole pack with a block-diagonal mask that states each sequence's own
alignment, window and ALiBi distances explicitly. Lengths: unequal, one sequence of length 1, an
empty query sequence, an empty key sequence, and one with N > M (bottom-right leaves rows
with nothing to see).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from numpy_attention.functional import attention_backward, attention_forward
from numpy_attention.gradcheck import gradcheck
from numpy_attention.varlen import varlen_attention_backward, varlen_attention_forward

from ..conftest import assert_close, assert_gradcheck

Q_LENGTHS = (3, 1, 0, 5, 4)
K_LENGTHS = (5, 1, 3, 0, 2)
H, D, DV = 4, 3, 2
ALIGNS = ["top-left", "bottom-right"]
OPTIONS = ["plain", "causal", "window", "softcap", "alibi-H", "alibi-SH", "sinks", "gqa"]


def offsets(lengths):
    """flash-attn's cu_seqlens: int32, 0 first, the packed total last."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


CU_Q, CU_K = offsets(Q_LENGTHS), offsets(K_LENGTHS)
T_Q, T_K, S = int(CU_Q[-1]), int(CU_K[-1]), len(Q_LENGTHS)


def make_packed(rng, kv_heads=H, dtype=np.float64):
    q = rng.standard_normal((T_Q, H, D)).astype(dtype)
    k = rng.standard_normal((T_K, kv_heads, D)).astype(dtype)
    v = rng.standard_normal((T_K, kv_heads, DV)).astype(dtype)
    return q, k, v


def make_options(rng, name, align, sequences=S):
    """The keyword arguments of one option (with the alignment), and the kv heads it needs."""
    options = {
        "plain": {},
        "causal": {"causal": True},
        "window": {"window": (2, 1)},
        "softcap": {"softcap": 1.5},
        "alibi-H": {"alibi_slopes": rng.uniform(0.1, 1.0, H)},
        "alibi-SH": {"alibi_slopes": rng.uniform(0.1, 1.0, (sequences, H))},
        "sinks": {"sinks": rng.standard_normal(H)},
        "gqa": {"enable_gqa": True},
    }[name]
    return {"align": align, **options}, (2 if name == "gqa" else H)


def sequence_options(options, s):
    """The options of sequence s alone: (S, H) ALiBi slopes give it row s."""
    slopes = options.get("alibi_slopes")
    if slopes is not None and slopes.ndim == 2:
        return {**options, "alibi_slopes": slopes[s]}
    return options


def per_sequence(q, k, v, options):
    """The oracle: ``attention_forward`` on each unpadded sequence, dense path."""
    results = []
    for s in range(S):
        rows, cols = slice(CU_Q[s], CU_Q[s + 1]), slice(CU_K[s], CU_K[s + 1])
        heads_first = (t.transpose(1, 0, 2) for t in (q[rows], k[cols], v[cols]))  # (H, n_s, W)
        results.append(
            attention_forward(
                *heads_first, impl="dense", return_lse=True, **sequence_options(options, s)
            )
        )
    return results


def pack(per_sequence_arrays, axis):
    return np.concatenate(per_sequence_arrays, axis=axis)


def assert_lse_close(actual, expected, *, dtype=None):
    """Rows with nothing to see (-inf) in the same places, the finite entries close."""
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg="lse")
    finite = np.isfinite(expected)
    assert_close(actual[finite], expected[finite], dtype=dtype, name="lse")


# -- against attention on each unpadded sequence ------------------------------------------------


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_forward_equals_attention_on_each_sequence(rng, option, align, impl):
    options, kv_heads = make_options(rng, option, align)
    q, k, v = make_packed(rng, kv_heads)

    out, lse, _ = varlen_attention_forward(
        q, k, v, CU_Q, CU_K, impl=impl, return_lse=True, **options
    )
    expected = per_sequence(q, k, v, options)

    assert out.shape == (T_Q, H, DV) and lse.shape == (H, T_Q)
    assert_close(out, pack([r.out.transpose(1, 0, 2) for r in expected], axis=0), name="out")
    assert_lse_close(lse, pack([r.lse for r in expected], axis=1))


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_backward_equals_attention_backward_on_each_sequence(rng, option, align, impl):
    options, kv_heads = make_options(rng, option, align)
    q, k, v = make_packed(rng, kv_heads)
    result = varlen_attention_forward(q, k, v, CU_Q, CU_K, impl=impl, **options)
    dout = rng.standard_normal(result.out.shape)
    dlse = rng.standard_normal((H, T_Q))

    grads = varlen_attention_backward(dout, result.ctx, dlse)
    expected = [
        attention_backward(dout[rows].transpose(1, 0, 2), seq.ctx, dlse[:, rows])
        for seq, rows in zip(
            per_sequence(q, k, v, options),
            (slice(CU_Q[s], CU_Q[s + 1]) for s in range(S)),
            strict=True,
        )
    ]

    for name in ("dq", "dk", "dv"):
        packed = pack([getattr(g, name).transpose(1, 0, 2) for g in expected], axis=0)
        assert_close(getattr(grads, name), packed, name=name)
    if "sinks" in options:  # one logit per head, shared by every sequence: the gradients add
        assert_close(grads.dsinks, sum(g.dsinks for g in expected), name="dsinks")
    else:
        assert grads.dsinks is None


@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_impl_chooses_the_path_of_every_sequence(rng, impl):
    q, k, v = make_packed(rng)

    out = varlen_attention_forward(q, k, v, CU_Q, CU_K, causal=True, impl=impl).out
    expected = [
        attention_forward(
            *(t.transpose(1, 0, 2) for t in (q[rows], k[cols], v[cols])), causal=True, impl=impl
        ).out.transpose(1, 0, 2)
        for rows, cols in zip(
            (slice(CU_Q[s], CU_Q[s + 1]) for s in range(S)),
            (slice(CU_K[s], CU_K[s + 1]) for s in range(S)),
            strict=True,
        )
    ]

    # The two paths round differently; each sequence's result is its path's, to the last bit.
    np.testing.assert_array_equal(out, pack(expected, axis=0))


# -- against one attention over the whole pack ---------------------------------------------------


def block_diagonal_bias(align, left, slopes):
    """A float (H, T_q, T_k) mask: -slope_{s,h} |p_i - j| inside sequence s's block and in its
    window (p_i - left <= j <= p_i, causal), -inf everywhere else. Positions are each sequence's
    own: query i of sequence s sits at p_i = i + (m_s - n_s if bottom-right else 0)."""
    bias = np.full((H, T_Q, T_K), -np.inf)
    for s, (n, m) in enumerate(zip(Q_LENGTHS, K_LENGTHS, strict=True)):
        position = np.arange(n)[:, None] + (m - n if align == "bottom-right" else 0)  # p_i
        distance = position - np.arange(m)[None, :]  # p_i - j, (n, m)
        visible = (distance >= 0) & (distance <= left)
        block = np.where(visible, -slopes[s][:, None, None] * np.abs(distance), -np.inf)
        bias[:, CU_Q[s] : CU_Q[s + 1], CU_K[s] : CU_K[s + 1]] = block
    return bias


@pytest.mark.parametrize("align", ALIGNS)
def test_forward_equals_one_attention_with_a_block_diagonal_mask(rng, align):
    q, k, v = make_packed(rng)
    slopes = rng.uniform(0.1, 1.0, (S, H))
    sinks = rng.standard_normal(H)
    options = {"causal": True, "window": (2, None), "softcap": 1.5, "sinks": sinks}

    out, lse, _ = varlen_attention_forward(
        q, k, v, CU_Q, CU_K, align=align, alibi_slopes=slopes, return_lse=True, **options
    )
    whole = attention_forward(
        *(t.transpose(1, 0, 2) for t in (q, k, v)),  # (H, T, W)
        attn_mask=block_diagonal_bias(align, 2, slopes),
        softcap=1.5,
        sinks=sinks,
        return_lse=True,
    )

    assert_close(out, whole.out.transpose(1, 0, 2), name="out")
    assert_lse_close(lse, whole.lse)


# -- isolation, empty sequences, dtypes ----------------------------------------------------------


@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_a_nan_in_one_sequence_stays_in_that_sequence(rng, impl):
    q, k, v = make_packed(rng)
    poisoned_k, poisoned_v = k.copy(), v.copy()
    poisoned_k[CU_K[1]], poisoned_v[CU_K[1]] = np.nan, np.nan  # sequence 1's only key
    dout = rng.standard_normal((T_Q, H, DV))

    clean = varlen_attention_forward(q, k, v, CU_Q, CU_K, impl=impl, return_lse=True)
    poisoned = varlen_attention_forward(
        q, poisoned_k, poisoned_v, CU_Q, CU_K, impl=impl, return_lse=True
    )
    clean_grads = varlen_attention_backward(dout, clean.ctx)
    poisoned_grads = varlen_attention_backward(dout, poisoned.ctx)

    rows = np.arange(T_Q)
    others = (rows < CU_Q[1]) | (rows >= CU_Q[2])
    cols = np.arange(T_K)
    other_cols = (cols < CU_K[1]) | (cols >= CU_K[2])
    assert np.all(np.isnan(poisoned.out[~others]))  # sequence 1's query sees the NaN
    np.testing.assert_array_equal(poisoned.out[others], clean.out[others])
    np.testing.assert_array_equal(poisoned.lse[:, others], clean.lse[:, others])
    np.testing.assert_array_equal(poisoned_grads.dq[others], clean_grads.dq[others])
    np.testing.assert_array_equal(poisoned_grads.dk[other_cols], clean_grads.dk[other_cols])
    np.testing.assert_array_equal(poisoned_grads.dv[other_cols], clean_grads.dv[other_cols])


def test_empty_sequences_give_zero_output_and_zero_gradient(rng):
    q, k, v = make_packed(rng)
    sinks = rng.standard_normal(H)
    dout = rng.standard_normal((T_Q, H, DV))
    dlse = rng.standard_normal((H, T_Q))

    out, lse, ctx = varlen_attention_forward(q, k, v, CU_Q, CU_K, sinks=sinks, return_lse=True)
    grads = varlen_attention_backward(dout, ctx, dlse)

    no_keys = slice(CU_Q[3], CU_Q[4])  # sequence 3: 5 queries, 0 keys
    assert np.all(out[no_keys] == 0) and np.all(grads.dq[no_keys] == 0)
    np.testing.assert_array_equal(lse[:, no_keys], np.repeat(sinks[:, None], 5, axis=1))
    no_queries = slice(CU_K[2], CU_K[3])  # sequence 2: 0 queries, 3 keys
    assert np.all(grads.dk[no_queries] == 0) and np.all(grads.dv[no_queries] == 0)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(g)) for g in grads)


def test_no_sequences_at_all(rng):
    q, k, v = np.zeros((0, H, D)), np.zeros((0, H, D)), np.zeros((0, H, DV))
    empty = np.zeros(1, dtype=np.int32)

    out, lse, ctx = varlen_attention_forward(q, k, v, empty, empty, return_lse=True)
    grads = varlen_attention_backward(np.zeros((0, H, DV)), ctx)

    assert out.shape == (0, H, DV) and lse.shape == (H, 0)
    assert grads.dq.shape == q.shape and grads.dk.shape == k.shape and grads.dv.shape == v.shape


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_stays_in_its_dtype_with_a_float32_lse(rng, dtype):
    q, k, v = make_packed(rng, dtype=dtype)
    dout = rng.standard_normal((T_Q, H, DV)).astype(dtype)
    golden = varlen_attention_forward(
        *(t.astype(np.float64) for t in (q, k, v)), CU_Q, CU_K, causal=True, return_lse=True
    )
    golden_grads = varlen_attention_backward(dout.astype(np.float64), golden.ctx)

    out, lse, ctx = varlen_attention_forward(q, k, v, CU_Q, CU_K, causal=True, return_lse=True)
    grads = varlen_attention_backward(dout, ctx)

    assert out.dtype == dtype and lse.dtype == np.float32
    assert all(getattr(grads, name).dtype == dtype for name in ("dq", "dk", "dv"))
    assert_close(out, golden.out, dtype=dtype, name="out")
    assert_lse_close(lse, golden.lse, dtype=np.float32)
    for name in ("dq", "dk", "dv"):
        assert_close(getattr(grads, name), getattr(golden_grads, name), dtype=dtype, name=name)


# -- finite differences --------------------------------------------------------------------------

# Small enough for central differences: every entry is perturbed twice.
GC_Q, GC_K = offsets((2, 1, 0, 3)), offsets((3, 2, 2, 0))


@pytest.mark.parametrize("option", ["causal", "window", "softcap", "alibi-SH", "gqa"])
def test_gradcheck_with_sinks_and_lse(rng, option):
    options, kv_heads = make_options(rng, option, "bottom-right", sequences=len(GC_Q) - 1)
    q = rng.standard_normal((int(GC_Q[-1]), H, D))
    k = rng.standard_normal((int(GC_K[-1]), kv_heads, D))
    v = rng.standard_normal((int(GC_K[-1]), kv_heads, DV))
    sinks = rng.standard_normal(H)

    def forward(q, k, v, sinks):
        """out with lse appended to each row (finite everywhere: the sinks), and the ctx."""
        out, lse, ctx = varlen_attention_forward(
            q, k, v, GC_Q, GC_K, sinks=sinks, return_lse=True, **options
        )
        return np.concatenate([out, lse.T[..., None]], axis=-1), ctx

    def backward(dresult, ctx):
        return varlen_attention_backward(dresult[..., :-1], ctx, dresult[..., -1].T)

    assert_gradcheck(gradcheck(forward, q, k, v, sinks, backward=backward))


# -- bad input -----------------------------------------------------------------------------------

BAD_OFFSETS = {
    "q-not-from-0": ({"cu_seqlens_q": [1, 3, 4, 4, 9, T_Q]}, ValueError, "cu_seqlens_q must"),
    "q-decreasing": ({"cu_seqlens_q": [0, 4, 3, 8, T_Q, T_Q]}, ValueError, "cu_seqlens_q must"),
    "k-short-of-total": (
        {"cu_seqlens_k": [0, 5, 6, 9, 9, T_K - 1]},
        ValueError,
        "cu_seqlens_k must",
    ),
    "k-past-total": ({"cu_seqlens_k": [0, 5, 6, 9, 9, T_K + 1]}, ValueError, "cu_seqlens_k must"),
    "q-float": ({"cu_seqlens_q": CU_Q.astype(np.float64)}, TypeError, "cu_seqlens_q must"),
    "k-bool": ({"cu_seqlens_k": np.ones(S + 1, dtype=bool)}, TypeError, "cu_seqlens_k must"),
    "q-2d": ({"cu_seqlens_q": CU_Q[None]}, ValueError, "cu_seqlens_q must"),
    "k-empty": ({"cu_seqlens_k": np.zeros(0, dtype=np.int32)}, ValueError, "cu_seqlens_k must"),
    "counts-differ": (
        {"cu_seqlens_k": [0, 5, 6, 9, T_K]},
        ValueError,
        "cu_seqlens_q and cu_seqlens_k",
    ),
}


@pytest.mark.parametrize("case", BAD_OFFSETS)
def test_bad_cu_seqlens_are_rejected_naming_the_argument(rng, case):
    q, k, v = make_packed(rng)
    replaced, error, match = BAD_OFFSETS[case]
    arguments = {"cu_seqlens_q": CU_Q, "cu_seqlens_k": CU_K, **replaced}

    with pytest.raises(error, match=match):
        varlen_attention_forward(q, k, v, **arguments)


BAD_LAYOUTS = {
    "q-batched": ("q", lambda q: q[None], ValueError, "q must be packed"),
    "k-heads-missing": ("k", lambda k: k[:, 0], ValueError, "k must be packed"),
    "v-length": ("v", lambda v: v[:-1], ValueError, "k and v must share the packed length"),
    "q-integer": ("q", lambda q: q.astype(int), TypeError, "q must be a floating"),
}


@pytest.mark.parametrize("case", BAD_LAYOUTS)
def test_wrong_layouts_are_rejected_naming_the_argument(rng, case):
    tensors = dict(zip("qkv", make_packed(rng), strict=True))
    name, change, error, match = BAD_LAYOUTS[case]
    tensors[name] = change(tensors[name])

    with pytest.raises(error, match=match):
        varlen_attention_forward(tensors["q"], tensors["k"], tensors["v"], CU_Q, CU_K)


def test_alibi_slopes_need_one_row_per_sequence(rng):
    q, k, v = make_packed(rng)

    with pytest.raises(ValueError, match="alibi_slopes"):
        varlen_attention_forward(q, k, v, CU_Q, CU_K, alibi_slopes=np.ones((S - 1, H)))


PACKED_SHAPES = {
    "heads without gqa": (
        (T_Q, H, D),
        (T_K, H // 2, D),
        {},
        rf"got q \({T_Q}, {H}, {D}\), k \({T_K}, {H // 2}, {D}\).*enable_gqa=True",
    ),
    "heads not a multiple": (
        (T_Q, H, D),
        (T_K, H - 1, D),
        {"enable_gqa": True},
        rf"H = {H} must be a multiple of the kv heads H_kv = {H - 1} \(q \({T_Q}, {H}, {D}\)",
    ),
    "slopes of other heads": (
        (T_Q, H, D),
        (T_K, H, D),
        {"alibi_slopes": np.ones((S, H + 1))},
        rf"alibi_slopes must be \(H,\) or \(S, H\) with H = {H} heads of q \({T_Q}, {H}, {D}\)",
    ),
}


@pytest.mark.parametrize("case", PACKED_SHAPES)
def test_shape_errors_name_the_packed_shapes_given(case):
    q_shape, kv_shape, options, match = PACKED_SHAPES[case]
    q, k, v = np.ones(q_shape), np.ones(kv_shape), np.ones(kv_shape)

    with pytest.raises(ValueError, match=match):
        varlen_attention_forward(q, k, v, CU_Q, CU_K, **options)


NO_SEQUENCE_BAD_OPTIONS = [
    ({"softcap": -1.0}, ValueError, "softcap must be >= 0"),
    ({"window": (-1, 0)}, ValueError, r"window\[0\] must be a non-negative int"),
    ({"sinks": np.ones(7)}, ValueError, r"sinks must be \(H,\)"),
    ({"align": "nope"}, ValueError, "align must be one of"),
    ({"dropout_p": 2.0}, ValueError, "dropout_p must be in"),
    ({"impl": "fast"}, ValueError, "impl must be one of"),
    ({"scale": np.nan}, ValueError, "scale must be finite"),
]


@pytest.mark.parametrize(("options", "error", "match"), NO_SEQUENCE_BAD_OPTIONS)
def test_options_are_checked_even_without_a_sequence(options, error, match):
    """No sequence means no per-sequence attention call, which used to be the only check: every
    option is checked once, before the sequences."""
    q, k, v, no_sequence = np.zeros((0, H, D)), np.zeros((0, H, D)), np.zeros((0, H, DV)), [0]

    with pytest.raises(error, match=match):
        varlen_attention_forward(q, k, v, no_sequence, no_sequence, **options)


@pytest.mark.parametrize(
    ("dout_shape", "dlse_shape", "name", "packed_shape"),
    [((T_Q, H, D + 1), (H, T_Q), "dout", (T_Q, H, DV)), ((T_Q, H, DV), (T_Q, H), "dlse", (H, T_Q))],
)
def test_backward_rejects_bad_gradients_naming_the_packed_shape(
    rng, dout_shape, dlse_shape, name, packed_shape
):
    ctx = varlen_attention_forward(*make_packed(rng), CU_Q, CU_K).ctx

    with pytest.raises(ValueError, match=rf"{name}.*{re.escape(str(packed_shape))}"):
        varlen_attention_backward(np.zeros(dout_shape), ctx, np.zeros(dlse_shape))


def test_backward_rejects_a_ctx_of_the_wrong_type(rng):
    q, k, v = make_packed(rng)
    attention_ctx = attention_forward(*(t.transpose(1, 0, 2) for t in (q, k, v))).ctx

    with pytest.raises(TypeError, match="varlen_attention_backward needs the ctx"):
        varlen_attention_backward(np.zeros((T_Q, H, DV)), attention_ctx)
