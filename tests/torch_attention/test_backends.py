"""torch_attention.backends: what "sdpa" and "flex" refuse (a clear ValueError naming the option
and the backend, before any work), "auto", which never picks a backend that would refuse and
computes what "math" computes, and the route "sdpa" takes for a causal call whose scale is not
positive. (The results of each backend, option by option, are tested in
test_functional_options.py.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from numpy_attention import functional as reference
from torch_attention import backends
from torch_attention.functional import BACKENDS, attention
from torch_attention.rules import prepare

from ..conftest import assert_close, to_torch

# name -> (backend, options, dtype, requires grad, return_lse, regex the message must match)
REFUSALS = {
    "sdpa softcap": ("sdpa", {"softcap": 2.0}, torch.float64, True, False, "softcap"),
    "sdpa sinks": ("sdpa", {"sinks": "sinks"}, torch.float64, True, False, "sinks"),
    "sdpa lse": ("sdpa", {}, torch.float64, False, True, "return_lse"),
    "sdpa dropout mask": (
        "sdpa",
        {"dropout_p": 0.2, "dropout_mask": "keep"},
        torch.float64,
        True,
        False,
        "explicit dropout_mask",
    ),
    "sdpa alibi float16": (
        "sdpa",
        {"alibi_slopes": "slopes"},
        torch.float16,
        False,
        False,
        "alibi_slopes in torch.float16",
    ),
    "sdpa alibi bfloat16": (
        "sdpa",
        {"alibi_slopes": "slopes"},
        torch.bfloat16,
        False,
        False,
        "alibi_slopes in torch.bfloat16",
    ),
    "flex dropout": ("flex", {"dropout_p": 0.2}, torch.float64, False, False, "dropout"),
    "flex dropout mask": (
        "flex",
        {"dropout_p": 0.2, "dropout_mask": "keep"},
        torch.float64,
        False,
        True,
        "dropout",
    ),
    "flex grad on CPU": ("flex", {}, torch.float64, True, False, "requires grad on CPU"),
}


def call_tensors(rng, options, dtype, requires_grad):
    """q (2, 4, 5, 8), k and v (2, 4, 7, 8) and the options, with named placeholders made into
    tensors."""
    q, k, v = (to_torch(rng.standard_normal((2, 4, n, 8))).to(dtype) for n in (5, 7, 7))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    made = {
        "sinks": to_torch(rng.standard_normal(4)).to(dtype),
        "slopes": to_torch(2.0 ** -np.arange(1, 5)),
        "keep": to_torch(rng.random((2, 4, 5, 7)) > 0.2),
    }
    return (q, k, v), {
        key: made.get(value, value) if isinstance(value, str) else value
        for key, value in options.items()
    }


@pytest.mark.parametrize("refused", REFUSALS)
def test_a_fused_backend_refuses_what_it_cannot_compute(rng, refused):
    backend, options, dtype, grad, return_lse, match = REFUSALS[refused]
    tensors, kwargs = call_tensors(rng, options, dtype, grad)

    with pytest.raises(
        ValueError, match=f"backend='{backend}' cannot compute this call: .*{match}"
    ):
        attention(*tensors, backend=backend, return_lse=return_lse, **kwargs)


def test_flex_runs_on_cpu_under_no_grad_and_says_nothing(rng):
    (q, k, v), _ = call_tensors(rng, {}, torch.float64, True)

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        out = attention(q, k, v, causal=True, backend="flex")

    assert_close(out, attention(q, k, v, causal=True, backend="math"), name="out")


# -- auto ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("softcap", [0.0, 2.0])
@pytest.mark.parametrize("sinks", [None, "sinks"])
@pytest.mark.parametrize("alibi_slopes", [None, "slopes"])
@pytest.mark.parametrize("dropout_mask", [None, "keep"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])
def test_auto_never_picks_a_backend_that_refuses(
    rng, softcap, sinks, alibi_slopes, dropout_mask, causal, dtype, requires_grad, return_lse
):
    """auto takes SDPA (the fastest) wherever it can compute the call exactly, elsewhere "manual"
    when a backward follows and "math" when none does, and runs exactly what it picked."""
    options = {
        "softcap": softcap,
        "sinks": sinks,
        "alibi_slopes": alibi_slopes,
        "dropout_mask": dropout_mask,
        "dropout_p": 0.3 if dropout_mask else 0.0,
        "causal": causal,
    }
    tensors, kwargs = call_tensors(rng, options, dtype, requires_grad)
    q, _, _, rules = prepare(*tensors, **kwargs)
    call = backends.Call(rules, return_lse, dtype, q.device, requires_grad)

    chosen = backends.choose(call)
    torch.manual_seed(0)
    auto = attention(*tensors, backend="auto", return_lse=return_lse, **kwargs)
    torch.manual_seed(0)
    explicit = attention(*tensors, backend=chosen, return_lse=return_lse, **kwargs)

    assert backends.refusal(chosen, call) is None
    behind_sdpa = "manual" if requires_grad else "math"
    assert chosen == (behind_sdpa if backends.refusal("sdpa", call) else "sdpa")
    for a, e in zip(
        auto if return_lse else [auto], explicit if return_lse else [explicit], strict=True
    ):
        assert torch.equal(a, e)


# -- sdpa -------------------------------------------------------------------------------------


def recording_sdpa(calls):
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    return sdpa


@pytest.mark.parametrize(
    ("options", "is_causal"),
    [
        ({"causal": True}, True),
        ({"window": (None, 0)}, True),
        ({"causal": True, "align": "bottom-right"}, False),
        ({"causal": True, "window": (2, None)}, False),
        ({"causal": True, "alibi_slopes": "slopes"}, False),
        ({"causal": True, "scale": 0.0}, False),  # SDPA's is_causal gives NaN here
        ({"causal": True, "scale": -1.0}, False),
        ({"causal": True, "scale": 1e-300}, True),  # positive in float64
    ],
)
def test_sdpa_uses_its_own_causal_mask_for_top_left_causal_alone(
    rng, monkeypatch, options, is_causal
):
    calls = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa(calls))
    tensors, kwargs = call_tensors(rng, options, torch.float64, False)

    attention(*tensors, backend="sdpa", **kwargs)

    assert calls[0]["is_causal"] is is_causal
    assert (calls[0]["attn_mask"] is None) is is_causal


@pytest.mark.parametrize("scale", [0.0, -0.5, 1e-300])  # 1e-300 is 0 in float32
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_causal_call_with_a_scale_of_zero_or_below_is_right_on_every_backend(rng, backend, scale):
    """The one disagreement of 10,400 fuzzed cases: causal with scale 0 gave NaN in out and every
    gradient on "sdpa" and "auto" (torch's fused CPU kernel with is_causal); each backend must
    give the NumPy core's result, out and dq/dk/dv (out only on flex: no CPU backward). NumPy
    computes in float32 too, so that a scale of 1e-300 is 0 on both sides."""
    q, k, v = (rng.standard_normal((1, 2, n, 8)).astype(np.float32) for n in (5, 7, 7))
    dout = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    backward = backend != "flex"
    tensors = [to_torch(t, requires_grad=backward) for t in (q, k, v)]

    out = attention(*tensors, causal=True, scale=scale, backend=backend)

    golden, _, ctx = reference.attention_forward(q, k, v, causal=True, scale=scale)
    assert_close(out, golden, name="out")
    if backward:
        out.backward(to_torch(dout))
        grads = reference.attention_backward(dout, ctx)
        for name, tensor, expected in zip("qkv", tensors, grads, strict=False):
            assert_close(tensor.grad, expected, name=f"d{name}")


def test_sdpa_passes_gqa_to_the_kernel_without_repeating_k_and_v(rng, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa(calls))
    q = to_torch(rng.standard_normal((2, 4, 5, 8)))
    k, v = (to_torch(rng.standard_normal((2, 1, 7, 8))) for _ in range(2))

    attention(q, k, v, enable_gqa=True, backend="sdpa")

    assert calls[0]["enable_gqa"] is True


def test_all_finite_sees_nan_and_inf_and_skips_none():
    assert backends.all_finite(torch.ones(3), None)
    assert not backends.all_finite(torch.ones(3), torch.tensor([1.0, float("inf")]))
    assert not backends.all_finite(torch.tensor([float("nan")]))
