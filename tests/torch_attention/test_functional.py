"""torch_attention.functional against the NumPy reference, on every backend.

The oracle is ``numpy_attention.functional`` in float64: output from ``attention_forward`` and
dq/dk/dv from the hand-derived ``attention_backward``, compared with each torch backend's output
and its autograd gradients under one random upstream gradient. Half precision is judged by the
kernel checker's policy (``parity_tests.check_kernel``); the edge rules of docs/design.md (empty
sequences, non-finite input, fully masked rows) are checked on every backend.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import functional as reference
from parity_tests import check_kernel
from parity_tests.checker.targets.torch_kernels import torch_attention_kernel
from torch_attention import functional
from torch_attention.functional import attention

from ..conftest import assert_close, to_numpy, to_torch

BACKENDS = ["auto", "sdpa", "math", "manual"]
# (leading axes, N, M, D, Dv): N != M with odd lengths, Dv != D, B = H = 1, no head axis.
SHAPES = {
    "B2H3-N37-M113-D16": ((2, 3), 37, 113, 16, 16),
    "B2H3-N37-M37-D16-Dv24": ((2, 3), 37, 37, 16, 24),
    "B1H1-N37-M113-D8": ((1, 1), 37, 113, 8, 8),
    "B2-N113-M37-D8-Dv4": ((2,), 113, 37, 8, 4),
}
MASKS = ["none", "padding", "bool", "float"]


def make_qkv(rng, lead, n, m, d, dv, dtype=np.float64):
    q = rng.standard_normal((*lead, n, d)).astype(dtype)
    k = rng.standard_normal((*lead, m, d)).astype(dtype)
    v = rng.standard_normal((*lead, m, dv)).astype(dtype)
    return q, k, v


def make_mask(rng, kind, lead, n, m):
    """Keyword arguments for one mask kind, as NumPy arrays.

    padding: batch element 0 loses its last key, the last element (when B > 1) is fully padded.
    bool: (N, M) "may attend" with query row 1 fully masked. float: (N, M) additive scores with
    some -inf entries and query row 1 all -inf.
    """
    if kind == "none":
        return {}
    if kind == "padding":
        padding = np.zeros((lead[0], m), dtype=bool)
        padding[0, -1] = True
        if lead[0] > 1:
            padding[-1] = True
        return {"key_padding_mask": padding}
    allowed = rng.random((n, m)) > 0.3
    allowed[:, 0] = True
    allowed[1] = False
    if kind == "bool":
        return {"attn_mask": allowed}
    return {"attn_mask": np.where(allowed, rng.standard_normal((n, m)), -np.inf)}


def as_torch(kwargs):
    """NumPy arrays (also inside a tuple) as tensors; other values as they are."""

    def convert(value):
        if isinstance(value, tuple):
            return tuple(convert(part) for part in value)
        return to_torch(value) if isinstance(value, np.ndarray) else value

    return {name: convert(value) for name, value in kwargs.items()}


def run_reference(q, k, v, dout, **kwargs):
    """NumPy forward and hand-derived backward: out, dq, dk, dv."""
    out, _, ctx = reference.attention_forward(q, k, v, **kwargs)
    return (out, *reference.attention_backward(dout, ctx)[:3])


def run_torch(q, k, v, dout, backend, **kwargs):
    """One torch backend: out and the autograd gradients of q, k and v, as NumPy arrays."""
    tq, tk, tv = (to_torch(t, requires_grad=True) for t in (q, k, v))
    out = attention(tq, tk, tv, backend=backend, **as_torch(kwargs))
    out.backward(to_torch(dout))
    return to_numpy(out), to_numpy(tq.grad), to_numpy(tk.grad), to_numpy(tv.grad)


def assert_all_close(actual, expected):
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected, strict=True):
        assert_close(a, e, name=name)


# -- parity with NumPy in float64 -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_matches_numpy(rng, backend, shape_name, causal, mask_kind):
    lead, n, m, d, dv = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m, d, dv)
    kwargs = {"causal": causal, **make_mask(rng, mask_kind, lead, n, m)}
    dout = rng.standard_normal((*lead, n, dv))

    actual = run_torch(q, k, v, dout, backend, **kwargs)

    assert_all_close(actual, run_reference(q, k, v, dout, **kwargs))


@pytest.mark.parametrize("backend", ["auto", "math", "manual"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_shape", ["full", "broadcast"])
def test_explicit_dropout_mask_matches_numpy(rng, backend, causal, mask_shape):
    lead, n, m, d, dv = SHAPES["B2H3-N37-M113-D16"]
    q, k, v = make_qkv(rng, lead, n, m, d, dv)
    keep_shape = (*lead, n, m) if mask_shape == "full" else (n, m)
    kwargs = {"causal": causal, "dropout_p": 0.3, "dropout_mask": rng.random(keep_shape) > 0.3}
    dout = rng.standard_normal((*lead, n, dv))

    actual = run_torch(q, k, v, dout, backend, **kwargs)

    assert_all_close(actual, run_reference(q, k, v, dout, **kwargs))


@pytest.mark.parametrize("backend", ["math", "manual"])
def test_dropout_without_mask_draws_from_torch_rng(rng, backend):
    lead, n, m, d, dv = SHAPES["B2H3-N37-M113-D16"]
    q, k, v = make_qkv(rng, lead, n, m, d, dv)
    dout = rng.standard_normal((*lead, n, dv))
    torch.manual_seed(7)
    actual = run_torch(q, k, v, dout, backend, dropout_p=0.3)

    torch.manual_seed(7)
    keep = to_numpy(torch.rand((*lead, n, m)) >= 0.3)

    expected = run_reference(q, k, v, dout, dropout_p=0.3, dropout_mask=keep)
    assert_all_close(actual, expected)


def test_sdpa_dropout_without_mask_is_seeded_and_drops(rng):
    q, k, v = (to_torch(t) for t in make_qkv(rng, *SHAPES["B2H3-N37-M113-D16"]))
    torch.manual_seed(7)
    first = attention(q, k, v, dropout_p=0.3, backend="sdpa")
    torch.manual_seed(7)
    again = attention(q, k, v, dropout_p=0.3, backend="sdpa")

    assert torch.equal(first, again)
    assert not torch.equal(first, attention(q, k, v, backend="sdpa"))


# -- edge rules: empty sequences --------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_no_keys_give_output_zero_and_gradient_zero(rng, backend, causal):
    q, k, v = (to_torch(t, requires_grad=True) for t in make_qkv(rng, (2, 3), 5, 0, 4, 6))

    out = attention(q, k, v, causal=causal, backend=backend)
    out.backward(to_torch(rng.standard_normal(out.shape)))

    assert out.shape == (2, 3, 5, 6)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(q.grad, torch.zeros_like(q))
    assert k.grad.shape == k.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_queries_give_an_empty_output(rng, backend):
    q, k, v = (to_torch(t, requires_grad=True) for t in make_qkv(rng, (2, 3), 0, 7, 4, 6))

    out = attention(q, k, v, backend=backend)
    out.sum().backward()

    assert out.shape == (2, 3, 0, 6)
    assert torch.equal(k.grad, torch.zeros_like(k))
    assert torch.equal(v.grad, torch.zeros_like(v))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [None, 1.0])
def test_zero_head_width_is_a_value_error(rng, backend, scale):
    q, k, v = (to_torch(t) for t in make_qkv(rng, (2, 3), 5, 7, 0, 6))

    with pytest.raises(ValueError, match="head width D = 0"):
        attention(q, k, v, scale=scale, backend=backend)


# -- edge rules: non-finite input -------------------------------------------------------------
# float32 with M = 7 and Dv = D: then torch 2.13's fused CPU SDPA kernel (Dv != D goes to its
# math kernel) handles every key in its vector tail, where it turns a query row holding NaN into
# 0, and it adds -inf to a hidden NaN score. The golden is the float64 reference on the same
# float32 numbers.

NAN, INF = float("nan"), float("inf")


def float32_case(rng, n, m):
    q, k, v = make_qkv(rng, (2, 3), n, m, 4, 4, dtype=np.float32)
    return q, k, v, rng.standard_normal((2, 3, n, 4)).astype(np.float32)


def golden(q, k, v, dout, **kwargs):
    """The float64 reference (out, dq, dk, dv) of float32 inputs."""
    return run_reference(*(t.astype(np.float64) for t in (q, k, v, dout)), **kwargs)


def assert_same_nan_rows_and_close(actual, expected, name="out"):
    """NaN exactly where the golden has NaN; the finite rest within the float32 tolerance."""
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), name
    finite = ~np.isnan(expected)
    assert_close(actual[finite], expected[finite], dtype=np.float32, name=name)


# The NumPy golden warns about the NaN and inf it computes with; that is NumPy's business here.
NON_FINITE = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@NON_FINITE
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_a_non_finite_query_reaches_exactly_its_own_row(rng, backend, value):
    q, k, v, dout = float32_case(rng, 5, 7)
    q[1, 2, 3, 0] = value

    out = run_torch(q, k, v, dout, backend)[0]

    expected = golden(q, k, v, dout)[0]
    assert np.isnan(expected[1, 2, 3]).all()
    assert np.isfinite(np.delete(expected.reshape(-1, 4), 1 * 15 + 2 * 5 + 3, axis=0)).all()
    assert_same_nan_rows_and_close(out, expected)


@NON_FINITE
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [NAN, INF])
def test_a_visible_non_finite_key_reaches_exactly_the_rows_that_see_it(rng, backend, value):
    q, k, v, dout = float32_case(rng, 5, 7)
    q[..., 0] = np.abs(q[..., 0]) + 0.5  # q . k = +inf (not -inf, a zero weight) for k = inf
    k[0, 1, 2, 0] = value  # under causal, rows 2, 3, 4 of head (0, 1) see key 2

    out = run_torch(q, k, v, dout, backend, causal=True)[0]

    expected = golden(q, k, v, dout, causal=True)[0]
    assert np.isnan(expected[0, 1, 2:]).all() and not np.isnan(expected[0, 1, :2]).any()
    assert_same_nan_rows_and_close(out, expected)


# name -> keyword arguments hiding key 4 of every query row (M = 7), as NumPy arrays
HIDING = {
    "padding": {"key_padding_mask": np.arange(7)[None, :].repeat(2, 0) == 4},
    "bool mask": {"attn_mask": np.arange(7) != 4},
    "-inf float mask": {"attn_mask": np.where(np.arange(7) == 4, -np.inf, 0.5)},
    "causal future": {"causal": True},
}


@NON_FINITE
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hiding", HIDING)
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_a_hidden_non_finite_key_never_leaks(rng, backend, hiding, value):
    q, k, v, dout = float32_case(rng, 4, 7)  # N = 4: under causal, key 4 is in every future
    k[:, :, 4, 1] = value
    kwargs = HIDING[hiding]

    out, _, _, dv = run_torch(q, k, v, dout, backend, **kwargs)

    expected = golden(q, k, v, dout, **kwargs)
    assert np.isfinite(out).all()
    assert_close(out, expected[0], dtype=np.float32, name="out")
    assert_close(dv, expected[3], dtype=np.float32, name="dv")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hiding", ["bool mask", "causal future"])
def test_a_value_at_a_hidden_key_is_multiplied_by_an_exact_zero(rng, backend, hiding):
    """IEEE 0 x NaN = NaN: a NaN value at a key hidden by a mask or the causal future reaches the
    rows of its head, on every backend as in the NumPy reference's dense path (documented in
    docs/torch-backends.md). Key padding is the exception: the next test."""
    q, k, v, dout = float32_case(rng, 4, 7)
    v[0, 1, 4, 0] = NAN

    out = run_torch(q, k, v, dout, backend, **HIDING[hiding])[0]

    expected = golden(q, k, v, dout, **HIDING[hiding])[0]
    assert np.isnan(expected[0, 1, :, 0]).all() and np.isnan(expected).sum() == 4
    assert_same_nan_rows_and_close(out, expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [NAN, INF])
def test_garbage_in_padding_is_never_read(rng, backend, value):
    """K and V rows that every query hides (key padding: an unwritten cache slot) are not
    multiplied by zeros but never read: every output and gradient stays finite, as in NumPy."""
    q, k, v, dout = float32_case(rng, 4, 7)
    padding = np.zeros((2, 7), dtype=bool)
    padding[0, 4:] = True
    padding[1] = True  # batch element 1: nothing to attend to
    clean = run_torch(q, k, v, dout, backend, key_padding_mask=padding)
    k[:, :, 4:], v[:, :, 4:] = value, value

    out, dq, dk, dv = run_torch(q, k, v, dout, backend, key_padding_mask=padding)

    assert np.array_equal(out, clean[0])
    assert all(np.isfinite(grad).all() for grad in (dq, dk, dv))
    assert np.all(dk[0, :, 4:] == 0) and np.all(dv[0, :, 4:] == 0)


def sdpa_reading_visible_values_only(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None
):
    """A fused kernel that never reads a hidden value (flash kernels skip masked blocks): it
    would hide a NaN value that the reference multiplies by an exact 0."""
    scores = query @ key.transpose(-2, -1) * scale
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    return probs @ value.nan_to_num() if not value.isfinite().all() else probs @ value


def test_sdpa_backend_keeps_the_exact_zero_rule_whatever_the_kernel_reads(rng, monkeypatch):
    q, k, v, dout = float32_case(rng, 4, 7)
    v[0, :, 4, 0] = NAN
    kwargs = HIDING["bool mask"]
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", sdpa_reading_visible_values_only
    )

    out = run_torch(q, k, v, dout, "sdpa", **kwargs)[0]

    assert_same_nan_rows_and_close(out, golden(q, k, v, dout, **kwargs)[0])


# -- edge rules on flex, forward only (FlexAttention has no CPU backward) ----------------------


def flex_edge_case(rng, name):
    """q, k, v (float64, Dv = D) and keyword arguments of one edge case, as NumPy arrays."""
    n, m = {"no keys": (5, 0), "no queries": (0, 7)}.get(name, (4, 7))
    q, k, v = make_qkv(rng, (2, 3), n, m, 4, 4)
    if name == "NaN query row":
        q[1, 2, 3, 0] = NAN
        return q, k, v, {}
    if name.startswith("hidden NaN key"):
        k[:, :, 4, 1] = NAN
        return q, k, v, HIDING[name.removeprefix("hidden NaN key, ")]
    if name == "dead rows":
        return q, k, v, make_mask(rng, "bool", (2, 3), n, m)
    return q, k, v, {}


FLEX_EDGES = [
    "no keys",
    "no queries",
    "NaN query row",
    *(f"hidden NaN key, {hiding}" for hiding in HIDING),
    "dead rows",
]


@pytest.mark.parametrize("edge", FLEX_EDGES)
def test_flex_keeps_the_edge_rules(rng, edge):
    q, k, v, kwargs = flex_edge_case(rng, edge)
    tensors = [to_torch(t) for t in (q, k, v)]

    out, lse = attention(*tensors, backend="flex", return_lse=True, **as_torch(kwargs))

    expected_out, expected_lse = attention(
        *tensors, backend="math", return_lse=True, **as_torch(kwargs)
    )
    for name, actual, expected in (("out", out, expected_out), ("lse", lse, expected_lse)):
        assert torch.equal(actual.isnan(), expected.isnan()), name
        assert torch.equal(actual == -INF, expected == -INF), name
        finite = torch.isfinite(expected)
        assert_close(actual[finite], expected[finite], name=name)


# -- edge rules: fully masked query rows ------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_kind", ["padding", "bool", "float"])
@pytest.mark.parametrize("dropout", [False, True])
def test_fully_masked_rows_give_zero_output_and_gradient(rng, backend, mask_kind, dropout):
    lead, n, m, d, dv = (2, 3), 5, 7, 4, 6
    q, k, v = (to_torch(t, requires_grad=True) for t in make_qkv(rng, lead, n, m, d, dv))
    masks = as_torch(make_mask(rng, mask_kind, lead, n, m))
    # padding empties batch element 1; the bool and float masks empty query row 1.
    empty = (1, ...) if mask_kind == "padding" else (..., 1, slice(None))
    out = attention(q, k, v, backend=backend, dropout_p=0.3 if dropout else 0.0, **masks)
    out.backward(to_torch(rng.standard_normal(out.shape)))

    assert torch.all(out[empty] == 0)
    assert torch.all(q.grad[empty] == 0)
    for tensor in (out, q.grad, k.grad, v.grad):
        assert torch.isfinite(tensor).all()


def nan_on_empty_rows_sdpa(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None
):
    """SDPA as its documentation writes it (a plain softmax), which is NaN on a row with nothing
    to attend to, as some SDPA kernels and torch versions are."""
    scores = query @ key.transpose(-2, -1) * scale
    if is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    return torch.softmax(scores, dim=-1) @ value


@pytest.mark.parametrize("mask_kind", ["padding", "bool", "float"])
def test_sdpa_backend_zeroes_empty_rows_whatever_the_kernel_does(rng, monkeypatch, mask_kind):
    lead, n, m, d, dv = SHAPES["B2H3-N37-M113-D16"]
    q, k, v = make_qkv(rng, lead, n, m, d, dv)
    kwargs = {"causal": True, **make_mask(rng, mask_kind, lead, n, m)}
    dout = rng.standard_normal((*lead, n, dv))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", nan_on_empty_rows_sdpa)

    actual = run_torch(q, k, v, dout, "sdpa", **kwargs)

    assert_all_close(actual, run_reference(q, k, v, dout, **kwargs))


# -- the manual backend's hand-derived backward -----------------------------------------------

GRADCHECK_CASES = ["plain", "causal+padding", "float-mask", "dropout", "fully-masked-row"]


@pytest.mark.parametrize("case", GRADCHECK_CASES)
def test_manual_backward_passes_torch_gradcheck(rng, case):
    lead, n, m, d, dv = (2, 2), 4, 5, 3, 2
    q, k, v = (to_torch(t, requires_grad=True) for t in make_qkv(rng, lead, n, m, d, dv))
    kwargs = {}
    if case == "causal+padding":
        kwargs = {"causal": True, **make_mask(rng, "padding", lead, n, m)}
    elif case == "float-mask":
        kwargs = {"attn_mask": rng.standard_normal((n, m))}
    elif case == "dropout":
        kwargs = {"dropout_p": 0.25, "dropout_mask": rng.random((*lead, n, m)) > 0.25}
    elif case == "fully-masked-row":
        kwargs = make_mask(rng, "bool", lead, n, m)
    kwargs = as_torch(kwargs)
    inputs = [q, k, v]
    if case == "float-mask":
        inputs.append(kwargs.pop("attn_mask").requires_grad_(True))

    def fn(q, k, v, *bias):
        mask = {"attn_mask": bias[0]} if bias else {}
        return attention(q, k, v, backend="manual", **kwargs, **mask)

    assert torch.autograd.gradcheck(fn, tuple(inputs))


# -- dtypes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_matches_numpy_float32(rng, backend):
    lead, n, m, d, dv = SHAPES["B2H3-N37-M113-D16"]
    q, k, v = make_qkv(rng, lead, n, m, d, dv, dtype=np.float32)
    kwargs = {"causal": True, **make_mask(rng, "padding", lead, n, m)}
    dout = rng.standard_normal((*lead, n, dv)).astype(np.float32)

    actual = run_torch(q, k, v, dout, backend, **kwargs)

    expected = run_reference(q, k, v, dout, **kwargs)
    assert all(a.dtype == np.float32 for a in actual)
    assert_all_close(actual, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_types_pass_the_kernel_checkers_policy(backend):
    """float16 and bfloat16 outputs and gradients against the float64 golden, judged by the
    kernel checker (docs/design.md's policy: a bound relative to a same-dtype plain baseline)."""
    report = check_kernel(torch_attention_kernel(backend), dtypes=(torch.float16, torch.bfloat16))

    assert report.passed, report.failures


# -- validation: the same errors as NumPy -----------------------------------------------------

# name -> (change to the valid call, exception, regex the message must match)
BAD_CALLS = {
    "int q": (lambda a: {**a, "q": a["q"].astype(np.int64)}, TypeError, "q must be"),
    "mixed dtypes": (lambda a: {**a, "k": a["k"].astype(np.float32)}, TypeError, "share one dtype"),
    "rank-1 q": (lambda a: {**a, "q": a["q"][0, 0, 0]}, ValueError, "at least 2 axes"),
    "leading axes": (lambda a: {**a, "k": a["k"][:1], "v": a["v"][:1]}, ValueError, "leading axes"),
    "D of k": (lambda a: {**a, "k": a["k"][..., :3]}, ValueError, "head width D"),
    "M of v": (lambda a: {**a, "v": a["v"][..., :6, :]}, ValueError, "key length M"),
    "D = 0": (
        lambda a: {**a, "q": a["q"][..., :0], "k": a["k"][..., :0]},
        ValueError,
        "head width D = 0",
    ),
    "padding dtype": (
        lambda a: {**a, "key_padding_mask": np.zeros((2, 7), dtype=np.int64)},
        TypeError,
        "key_padding_mask",
    ),
    "padding shape": (
        lambda a: {**a, "key_padding_mask": np.zeros((2, 6), dtype=bool)},
        ValueError,
        "key_padding_mask",
    ),
    "padding on unbatched q": (
        lambda a: {
            **{name: a[name][0, 0] for name in "qkv"},
            "key_padding_mask": np.zeros((2, 7), dtype=bool),
        },
        ValueError,
        "key_padding_mask",
    ),
    "attn_mask dtype": (
        lambda a: {**a, "attn_mask": np.ones((5, 7), dtype=np.int64)},
        TypeError,
        "attn_mask",
    ),
    "attn_mask shape": (
        lambda a: {**a, "attn_mask": np.ones((7, 5), dtype=bool)},
        ValueError,
        "attn_mask",
    ),
    "dropout_p 1": (lambda a: {**a, "dropout_p": 1.0}, ValueError, "dropout_p"),
    "dropout_p negative": (lambda a: {**a, "dropout_p": -0.1}, ValueError, "dropout_p"),
    "dropout_p string": (lambda a: {**a, "dropout_p": "0.1"}, TypeError, "dropout_p"),
    "dropout_mask dtype": (
        lambda a: {**a, "dropout_p": 0.2, "dropout_mask": np.ones((5, 7))},
        TypeError,
        "dropout_mask",
    ),
    "dropout_mask shape": (
        lambda a: {**a, "dropout_p": 0.2, "dropout_mask": np.ones((5, 6), dtype=bool)},
        ValueError,
        "dropout_mask",
    ),
    "dropout_mask without p": (
        lambda a: {**a, "dropout_mask": np.ones((5, 7), dtype=bool)},
        ValueError,
        "dropout probability is 0",
    ),
    "scale string": (lambda a: {**a, "scale": "2"}, TypeError, "scale"),
    "scale nan": (lambda a: {**a, "scale": float("nan")}, ValueError, "scale must be finite"),
    "scale inf": (lambda a: {**a, "scale": float("inf")}, ValueError, "scale must be finite"),
    "causal string": (lambda a: {**a, "causal": "no"}, TypeError, "causal must be a bool"),
    "causal int": (lambda a: {**a, "causal": 1}, TypeError, "causal must be a bool"),
    "fewer kv heads without enable_gqa": (
        lambda a: {**a, "k": a["k"][:, :1], "v": a["v"][:, :1]},
        ValueError,
        r"share their leading axes.*enable_gqa=True",
    ),
    "H not a multiple of H_kv": (
        lambda a: {**a, "k": a["k"][:, :2], "v": a["v"][:, :2], "enable_gqa": True},
        ValueError,
        r"H = 3 must be a multiple of the kv heads H_kv = 2",
    ),
    "enable_gqa string": (lambda a: {**a, "enable_gqa": "yes"}, TypeError, "enable_gqa"),
    "window negative": (lambda a: {**a, "window": (-1, 2)}, ValueError, r"window\[0\]"),
    "window float": (lambda a: {**a, "window": (None, 1.5)}, TypeError, r"window\[1\]"),
    "window int": (lambda a: {**a, "window": 3}, TypeError, r"window must be \(left, right\)"),
    "align": (lambda a: {**a, "align": "top"}, ValueError, "align must be one of"),
    "softcap negative": (lambda a: {**a, "softcap": -1.0}, ValueError, "softcap must be >= 0"),
    "softcap nan": (lambda a: {**a, "softcap": float("nan")}, ValueError, "softcap must be finite"),
    "alibi_slopes of 2 heads": (
        lambda a: {**a, "alibi_slopes": np.ones(2)},
        ValueError,
        r"alibi_slopes must be \(H,\) or \(B, H\).*\(2,\)",
    ),
    "alibi_slopes of another batch": (
        lambda a: {**a, "alibi_slopes": np.ones((3, 3))},
        ValueError,
        r"alibi_slopes \(B, H\) = \(3, 3\)",
    ),
    "alibi_slopes int": (
        lambda a: {**a, "alibi_slopes": np.ones(3, dtype=np.int64)},
        TypeError,
        "alibi_slopes",
    ),
    "alibi_slopes inf": (
        lambda a: {**a, "alibi_slopes": np.array([0.5, np.inf, 1.0])},
        ValueError,
        "alibi_slopes must be finite",
    ),
    "sinks of 2 heads": (lambda a: {**a, "sinks": np.ones(2)}, ValueError, r"sinks must be \(H,\)"),
    "sinks float32": (
        lambda a: {**a, "sinks": np.ones(3, dtype=np.float32)},
        TypeError,
        "sinks must have the dtype",
    ),
    "return_lse int": (lambda a: {**a, "return_lse": 1}, TypeError, "return_lse must be a bool"),
    "sinks -inf": (
        lambda a: {**a, "sinks": np.array([0.0, -np.inf, 1.0])},
        ValueError,
        "sinks must be finite",
    ),
    "chunk_size 0": (lambda a: {**a, "chunk_size": 0}, ValueError, "chunk_size must be a positive"),
    "chunk_start alone": (lambda a: {**a, "chunk_start": 1}, ValueError, "without chunk_size"),
    "chunk_start float": (
        lambda a: {**a, "chunk_size": 2, "chunk_start": 0.5},
        TypeError,
        "chunk_start must be an int",
    ),
    "chunk_start of another batch": (
        lambda a: {**a, "chunk_size": 2, "chunk_start": np.zeros(3, dtype=np.int64)},
        ValueError,
        r"chunk_start must be an int or \(B,\)",
    ),
    "attn_mask bool and float together": (
        lambda a: {**a, "attn_mask": (np.ones((5, 7), dtype=bool), np.zeros((5, 7)))},
        TypeError,
        "attn_mask must be one",
    ),
}


def valid_call(rng):
    q, k, v = make_qkv(rng, (2, 3), 5, 7, 4, 6)
    return {"q": q, "k": k, "v": v}


@pytest.mark.parametrize("backend", [*BACKENDS, "flex"])
@pytest.mark.parametrize("bad", BAD_CALLS)
def test_bad_input_raises_like_numpy(rng, backend, bad):
    change, error, match = BAD_CALLS[bad]
    kwargs = change(valid_call(rng))

    with pytest.raises(error, match=match):
        reference.attention(**kwargs)
    with pytest.raises(error, match=match):
        attention(**as_torch(kwargs), backend=backend)


def test_q_must_be_a_tensor(rng):
    kwargs = as_torch(valid_call(rng))

    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        attention(to_numpy(kwargs.pop("q")), **kwargs)


def test_unknown_backend_is_a_value_error(rng):
    with pytest.raises(ValueError, match="backend must be one of"):
        attention(**as_torch(valid_call(rng)), backend="flash")


def test_sdpa_refuses_an_explicit_dropout_mask(rng):
    kwargs = as_torch(valid_call(rng))
    keep = torch.ones(5, 7, dtype=torch.bool)

    with pytest.raises(ValueError, match="backend='sdpa' cannot compute .* explicit dropout_mask"):
        attention(**kwargs, dropout_p=0.2, dropout_mask=keep, backend="sdpa")


# -- softmax and heads ------------------------------------------------------------------------


def test_softmax_matches_numpy_with_a_dead_row(rng):
    scores = rng.standard_normal((3, 5, 7))
    scores[1, 2] = -np.inf

    probs = functional.softmax(to_torch(scores))

    assert_close(probs, reference.softmax_forward(scores)[0], name="probs")
    assert torch.equal(probs[1, 2], torch.zeros(7, dtype=torch.float64))


def test_split_and_merge_heads_match_numpy(rng):
    x = rng.standard_normal((2, 5, 12))

    heads = functional.split_heads(to_torch(x), 3)

    assert_close(heads, reference.split_heads_forward(x, 3)[0], name="split")
    assert_close(functional.merge_heads(heads), x, name="merge")
