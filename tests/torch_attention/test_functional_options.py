"""torch_attention.functional.attention with today's options (GQA, alignment, windows, softcap,
ALiBi, sinks, lse), option by option, on every backend that takes them.

The oracle is the NumPy core in float64 (``attention_forward`` / ``attention_backward`` with
``dlse``): out, lse and dq/dk/dv/dsinks under a random upstream gradient of out and of lse.
float64 within FLOAT64_RTOL, float32 within FLOAT32_RTOL of the same golden, each tensor on its
own scale; the manual backend's hand-derived backward also passes torch's gradcheck on every
option, and agrees with autograd ("math") on the gradients NumPy does not return (float mask,
ALiBi slopes). What a backend cannot compute is refused, never approximated.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import functional as reference
from torch_attention.functional import attention
from torch_attention.scores import AttentionOutput

from ..conftest import assert_close, to_numpy, to_torch

B, H, D, DV = 2, 4, 8, 6


def case_options(rng, name, b, h, n, m):
    """The options of case ``name`` (NumPy arrays) for q (b, h, N, D), and H_kv."""
    slopes = 2.0 ** -np.arange(1, h + 1)  # ALiBi's geometric slopes
    sinks = rng.standard_normal(h)
    dead = rng.random((n, m)) > 0.3
    dead[1] = False  # query row 1 sees nothing
    padding = np.zeros((b, m), dtype=bool)
    padding[0, -2:] = True
    cases = {
        "plain": ({}, h),
        "gqa": ({"enable_gqa": True}, h // 2),
        "mqa": ({"enable_gqa": True}, 1),
        "causal": ({"causal": True}, h),
        "causal bottom-right": ({"causal": True, "align": "bottom-right"}, h),
        "window": ({"window": (2, 1)}, h),
        "window + causal": ({"window": (1, None), "causal": True}, h),
        "window bottom-right": ({"window": (3, 0), "align": "bottom-right"}, h),
        "softcap": ({"softcap": 1.5, "scale": 1.0}, h),
        "alibi": ({"alibi_slopes": slopes}, h),
        "alibi (B, H) bottom-right": (
            {"alibi_slopes": slopes * rng.uniform(0.5, 2.0, (b, 1)), "align": "bottom-right"},
            h,
        ),
        "float mask": ({"attn_mask": rng.standard_normal((h, n, m))}, h),
        "bool mask + padding": ({"attn_mask": dead, "key_padding_mask": padding}, h),
        "sinks": ({"sinks": sinks}, h),
        "sinks + dead rows": ({"sinks": sinks, "attn_mask": dead}, h),
        "chunk": ({"causal": True, "chunk_size": 2}, h),
        "chunk start (B,) bottom-right": (
            {"causal": True, "align": "bottom-right", "chunk_size": 3}
            | {"chunk_start": np.arange(b) * 2, "enable_gqa": True},
            h // 2,
        ),
        "dropout": ({"dropout_p": 0.3, "dropout_mask": rng.random((b, h, n, m)) > 0.3}, h),
        "everything": (
            {
                "enable_gqa": True,
                "causal": True,
                "align": "bottom-right",
                "window": (3, None),
                "softcap": 2.0,
                "alibi_slopes": slopes,
                "attn_mask": rng.standard_normal((n, m)),
                "key_padding_mask": padding,
                "sinks": sinks,
            },
            h // 2,
        ),
    }
    return cases[name]


CASES = [
    "plain",
    "gqa",
    "mqa",
    "causal",
    "causal bottom-right",
    "window",
    "window + causal",
    "window bottom-right",
    "softcap",
    "alibi",
    "alibi (B, H) bottom-right",
    "float mask",
    "bool mask + padding",
    "sinks",
    "sinks + dead rows",
    "chunk",
    "chunk start (B,) bottom-right",
    "dropout",
    "everything",
]
# (N, M): more keys than queries, and more queries than keys (bottom-right then leaves the first
# N - M rows with nothing to see under causal).
LENGTHS = {"N5-M7": (5, 7), "N7-M5": (7, 5)}
# What each fused backend refuses (tested in test_backends.py), by case.
SDPA_REFUSES = {"softcap", "sinks", "sinks + dead rows", "dropout", "everything"}
FLEX_REFUSES = {"dropout"}
# (backend, case) for every case a backend takes
TAKEN = [
    (backend, case)
    for backend, refused in (
        ("math", ()),
        ("manual", ()),
        ("sdpa", SDPA_REFUSES),
        ("flex", FLEX_REFUSES),
    )
    for case in CASES
    if case not in refused
]


def make_case(rng, name, lengths, dtype=np.float64):
    """q, k, v, the options, and the upstream gradients of out and lse, as NumPy arrays."""
    n, m = LENGTHS[lengths]
    options, kv_heads = case_options(rng, name, B, H, n, m)
    q = rng.standard_normal((B, H, n, D)).astype(dtype)
    k = rng.standard_normal((B, kv_heads, m, D)).astype(dtype)
    v = rng.standard_normal((B, kv_heads, m, DV)).astype(dtype)
    if "sinks" in options:
        options["sinks"] = options["sinks"].astype(dtype)
    dout = rng.standard_normal((B, H, n, DV)).astype(dtype)
    dlse = rng.standard_normal((B, H, n)).astype(dtype)
    return q, k, v, options, dout, dlse


def golden(q, k, v, options, dout, dlse):
    """The float64 NumPy core: out, lse, dq, dk, dv, dsinks (dsinks None without sinks)."""
    wide = {key: a.astype(np.float64) if key == "sinks" else a for key, a in options.items()}
    result = reference.attention_forward(
        *(t.astype(np.float64) for t in (q, k, v)), return_lse=True, **wide
    )
    grads = reference.attention_backward(
        dout.astype(np.float64), result.ctx, dlse=None if dlse is None else dlse.astype(np.float64)
    )
    return {
        "out": result.out,
        "lse": result.lse,
        "dq": grads.dq,
        "dk": grads.dk,
        "dv": grads.dv,
        "dsinks": grads.dsinks,
    }


def run(q, k, v, options, dout, dlse, backend):
    """One torch backend: out (and lse), and with ``dout`` the autograd gradients, as NumPy."""
    grad = dout is not None
    tensors = [to_torch(t, requires_grad=grad) for t in (q, k, v)]
    kwargs = {key: to_torch(a) if isinstance(a, np.ndarray) else a for key, a in options.items()}
    if "sinks" in kwargs:
        kwargs["sinks"].requires_grad_(grad)
    with_lse = dlse is not None or backend == "flex"
    result = attention(*tensors, backend=backend, return_lse=with_lse, **kwargs)
    out, lse = (result.out, result.lse) if with_lse else (result, None)
    actual = {"out": to_numpy(out)}
    if lse is not None:
        actual["lse"] = to_numpy(lse)
    if grad:
        outputs, upstream = [out], [to_torch(dout)]
        if dlse is not None:
            outputs.append(lse)
            upstream.append(to_torch(dlse).to(lse.dtype))
        torch.autograd.backward(outputs, upstream)
        actual.update(zip(("dq", "dk", "dv"), (to_numpy(t.grad) for t in tensors), strict=True))
        if "sinks" in kwargs:
            actual["dsinks"] = to_numpy(kwargs["sinks"].grad)
    return actual


def assert_matches(actual, expected, dtype):
    """Every tensor the backend gave, against the golden, each on its own scale."""
    for name, value in actual.items():
        if name == "lse":  # -inf on rows with nothing to attend to, exactly
            dead = np.isneginf(expected["lse"])
            assert np.array_equal(np.isneginf(value), dead), name
            assert_close(value[~dead], expected["lse"][~dead], dtype=dtype, name=name)
        else:
            assert_close(value, expected[name], dtype=dtype, name=name)


# -- float64: every backend against the golden -------------------------------------------------


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["math", "manual"])
def test_plain_backends_match_the_golden_with_an_lse_gradient(rng, backend, case, lengths):
    q, k, v, options, dout, dlse = make_case(rng, case, lengths)

    actual = run(q, k, v, options, dout, dlse, backend)

    assert set(actual) == {"out", "lse", "dq", "dk", "dv"} | (
        {"dsinks"} if "sinks" in options else set()
    )
    assert_matches(actual, golden(q, k, v, options, dout, dlse), np.float64)


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("case", sorted(set(CASES) - SDPA_REFUSES))
def test_sdpa_matches_the_golden(rng, case, lengths):
    q, k, v, options, dout, _ = make_case(rng, case, lengths)

    actual = run(q, k, v, options, dout, None, "sdpa")

    assert_matches(actual, golden(q, k, v, options, dout, None), np.float64)


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("case", sorted(set(CASES) - FLEX_REFUSES))
def test_flex_matches_the_golden_forward(rng, case, lengths):
    """FlexAttention has no CPU backward: out and lse only."""
    q, k, v, options, dout, _ = make_case(rng, case, lengths)

    actual = run(q, k, v, options, None, None, "flex")

    assert set(actual) == {"out", "lse"}
    assert_matches(actual, golden(q, k, v, options, dout, None), np.float64)


# -- float32: every backend within the float32 tolerance of the float64 golden ------------------


@pytest.mark.parametrize(("backend", "case"), TAKEN)
def test_float32_is_within_float32_rounding_of_the_golden(rng, backend, case):
    q, k, v, options, dout, dlse = make_case(rng, case, "N5-M7", np.float32)
    grads = backend in ("math", "manual")

    actual = run(
        q,
        k,
        v,
        options,
        dout if grads or backend == "sdpa" else None,
        dlse if grads else None,
        backend,
    )

    assert all(value.dtype == np.float32 for value in actual.values())
    assert_matches(actual, golden(q, k, v, options, dout, dlse if grads else None), np.float32)


# -- the manual backend's hand-derived backward -------------------------------------------------


def small_case(rng, name):
    """A case small enough for finite differences: B = 1, H = 2, N = 3, M = 4, D = 3, Dv = 2."""
    options, kv_heads = case_options(rng, name, 1, 2, 3, 4)
    q = rng.standard_normal((1, 2, 3, 3))
    k = rng.standard_normal((1, kv_heads, 4, 3))
    v = rng.standard_normal((1, kv_heads, 4, 2))
    return q, k, v, options


@pytest.mark.parametrize("case", CASES)
def test_manual_backward_passes_gradcheck_on_every_option(rng, case):
    """Finite differences on q, k, v and on every tensor option that has a gradient (the float
    mask, the ALiBi slopes, the sinks), through both outputs, out and lse."""
    q, k, v, options = small_case(rng, case)
    differentiable = [
        name
        for name in ("attn_mask", "alibi_slopes", "sinks")
        if name in options and options[name].dtype == np.float64
    ]
    fixed = {
        key: to_torch(a) if isinstance(a, np.ndarray) else a
        for key, a in options.items()
        if key not in differentiable
    }
    inputs = [to_torch(t, requires_grad=True) for t in (q, k, v)]
    inputs += [to_torch(options[name], requires_grad=True) for name in differentiable]

    def fn(q, k, v, *tensors):
        result = attention(
            q,
            k,
            v,
            backend="manual",
            return_lse=True,
            **fixed,
            **dict(zip(differentiable, tensors, strict=True)),
        )
        return result.out, result.lse.masked_fill(result.lse == float("-inf"), 0.0)

    assert torch.autograd.gradcheck(fn, tuple(inputs))


@pytest.mark.parametrize("case", ["float mask", "alibi", "alibi (B, H) bottom-right", "everything"])
def test_manual_and_math_agree_on_the_gradients_numpy_does_not_give(rng, case):
    """The float mask's and the ALiBi slopes' gradients: hand-derived against autograd."""
    q, k, v, options, dout, dlse = make_case(rng, case, "N5-M7")
    grads = {}
    for backend in ("math", "manual"):
        kwargs = {
            key: to_torch(a) if isinstance(a, np.ndarray) else a for key, a in options.items()
        }
        for name in ("attn_mask", "alibi_slopes"):
            if name in kwargs:
                kwargs[name].requires_grad_(True)
        result = attention(
            *(to_torch(t) for t in (q, k, v)), backend=backend, return_lse=True, **kwargs
        )
        torch.autograd.backward([result.out, result.lse], [to_torch(dout), to_torch(dlse)])
        grads[backend] = {
            name: kwargs[name].grad for name in ("attn_mask", "alibi_slopes") if name in kwargs
        }

    assert grads["manual"].keys() == grads["math"].keys() != set()
    for name, expected in grads["math"].items():
        assert_close(grads["manual"][name], expected, name=name)


# -- lse: its type, its dtype, and the rows with nothing to attend to ----------------------------


@pytest.mark.parametrize("backend", ["math", "manual", "flex"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_return_lse_gives_an_attention_output_with_lse_in_the_compute_dtype(rng, backend, dtype):
    q, k, v = (to_torch(rng.standard_normal((2, 3, 5, 4))).to(dtype) for _ in range(3))

    result = attention(q, k, v, backend=backend, return_lse=True)
    plain = attention(q, k, v, backend=backend)

    assert isinstance(result, AttentionOutput) and isinstance(plain, torch.Tensor)
    assert result.out.dtype == dtype and result.out.shape == (2, 3, 5, 4)
    expected = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    assert result.lse.dtype == expected and result.lse.shape == (2, 3, 5)
    assert torch.equal(result.out, plain)


@pytest.mark.parametrize("backend", ["math", "manual", "flex"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_no_keys_give_output_zero_and_lse_minus_inf_or_the_sink(rng, backend, with_sinks):
    q = to_torch(rng.standard_normal((2, 3, 5, 4)))
    k, v = (
        torch.zeros(2, 3, 0, 4, dtype=torch.float64),
        torch.zeros(2, 3, 0, 6, dtype=torch.float64),
    )
    sinks = to_torch(rng.standard_normal(3)) if with_sinks else None

    out, lse = attention(q, k, v, sinks=sinks, backend=backend, return_lse=True)

    expected = (
        sinks[:, None].expand(2, 3, 5)
        if with_sinks
        else torch.full((2, 3, 5), -np.inf, dtype=torch.float64)
    )
    assert torch.equal(out, torch.zeros(2, 3, 5, 6, dtype=torch.float64))
    assert torch.equal(lse, expected)
