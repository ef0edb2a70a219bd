"""torch_attention.functional against the NumPy reference, on every backend.

The oracle is ``numpy_attention.functional`` in float64: output from ``attention_forward`` and
dq/dk/dv from the hand-derived ``attention_backward``, compared with each torch backend's output
and its autograd gradients under one random upstream gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import functional as reference
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


def run_reference(q, k, v, dout, **kwargs):
    """NumPy forward and hand-derived backward: out, dq, dk, dv."""
    out, _, ctx = reference.attention_forward(q, k, v, **kwargs)
    return (out, *reference.attention_backward(dout, ctx)[:3])


def run_torch(q, k, v, dout, backend, **kwargs):
    """One torch backend: out and the autograd gradients of q, k and v, as NumPy arrays."""
    tq, tk, tv = (to_torch(t, requires_grad=True) for t in (q, k, v))
    masks = {
        name: to_torch(value) if isinstance(value, np.ndarray) else value
        for name, value in kwargs.items()
    }
    out = attention(tq, tk, tv, backend=backend, **masks)
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


# -- fully masked query rows ------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_kind", ["padding", "bool", "float"])
@pytest.mark.parametrize("dropout", [False, True])
def test_fully_masked_rows_give_zero_output_and_gradient(rng, backend, mask_kind, dropout):
    lead, n, m, d, dv = (2, 3), 5, 7, 4, 6
    q, k, v = (to_torch(t, requires_grad=True) for t in make_qkv(rng, lead, n, m, d, dv))
    masks = {name: to_torch(value) for name, value in make_mask(rng, mask_kind, lead, n, m).items()}
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
    kwargs = {
        name: to_torch(value) if isinstance(value, np.ndarray) else value
        for name, value in kwargs.items()
    }
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
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_run_and_keep_their_dtype(rng, backend, dtype):
    lead, n, m, d, dv = SHAPES["B2H3-N37-M37-D16-Dv24"]
    q, k, v = (to_torch(t).to(dtype).requires_grad_(True) for t in make_qkv(rng, lead, n, m, d, dv))
    masks = {name: to_torch(value) for name, value in make_mask(rng, "float", lead, n, m).items()}

    out = attention(q, k, v, causal=True, backend=backend, **masks)
    out.backward(to_torch(rng.standard_normal(out.shape)).to(dtype))

    assert out.dtype == dtype
    assert (q.grad.dtype, k.grad.dtype, v.grad.dtype) == (dtype, dtype, dtype)
    for tensor in (out, q.grad, k.grad, v.grad):
        assert torch.isfinite(tensor).all()


# -- validation: the same errors as NumPy -----------------------------------------------------

# name -> (change to the valid call, exception, regex the message must match)
BAD_CALLS = {
    "int q": (lambda a: {**a, "q": a["q"].astype(np.int64)}, TypeError, "q must be"),
    "mixed dtypes": (lambda a: {**a, "k": a["k"].astype(np.float32)}, TypeError, "share one dtype"),
    "rank-1 q": (lambda a: {**a, "q": a["q"][0, 0, 0]}, ValueError, "at least 2 axes"),
    "leading axes": (lambda a: {**a, "k": a["k"][:1]}, ValueError, "leading axes"),
    "D of k": (lambda a: {**a, "k": a["k"][..., :3]}, ValueError, "head width D"),
    "M of v": (lambda a: {**a, "v": a["v"][..., :6, :]}, ValueError, "key length M"),
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
        "dropout_p == 0",
    ),
    "scale string": (lambda a: {**a, "scale": "2"}, TypeError, "scale"),
}


def valid_call(rng):
    q, k, v = make_qkv(rng, (2, 3), 5, 7, 4, 6)
    return {"q": q, "k": k, "v": v}


def as_torch(kwargs):
    return {
        name: to_torch(value) if isinstance(value, np.ndarray) else value
        for name, value in kwargs.items()
    }


@pytest.mark.parametrize("backend", BACKENDS)
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

    with pytest.raises(ValueError, match="cannot take an explicit dropout_mask"):
        attention(**kwargs, dropout_p=0.2, dropout_mask=keep, backend="sdpa")


# -- heads ------------------------------------------------------------------------------------


def test_split_and_merge_heads_match_numpy(rng):
    x = rng.standard_normal((2, 5, 12))

    heads = functional.split_heads(to_torch(x), 3)

    assert_close(heads, reference.split_heads_forward(x, 3)[0], name="split")
    assert_close(functional.merge_heads(heads), x, name="merge")
