"""torch_attention.varlen: the torch twin of the NumPy packed attention, differentiable by
autograd.

The oracle is NumPy's ``varlen_attention_forward`` / ``varlen_attention_backward`` (hand-derived,
itself checked against attention on each unpadded sequence and a block-diagonal dense attention
in tests/numpy_attention/test_varlen.py), in float64: out, lse, and dq, dk, dv and dsinks through
autograd, on every backend that computes the option. The same lengths as there: unequal, a
length-1 sequence, an empty query sequence, an empty key sequence, N > M. Bad input raises what
NumPy raises, naming the packed shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.varlen import varlen_attention_backward, varlen_attention_forward
from torch_attention import varlen_attention

from ..conftest import assert_close, to_numpy, to_torch
from ..numpy_attention.test_varlen import (
    ALIGNS,
    CU_K,
    CU_Q,
    NO_SEQUENCE_BAD_OPTIONS,
    OPTIONS,
    PACKED_SHAPES,
    make_options,
    make_packed,
)

# The backends that compute forward and backward on the CPU; sdpa refuses softcap and sinks
# (its refusals are tested in test_functional_options.py), flex has no CPU backward.
BACKENDS = ["math", "manual", "auto"]


def numpy_run(q, k, v, options, dout, dlse, sinks):
    forward = varlen_attention_forward(q, k, v, CU_Q, CU_K, sinks=sinks, return_lse=True,
                                       **options)  # fmt: skip
    grads = varlen_attention_backward(dout, forward.ctx, dlse)
    return {"out": forward.out, "lse": forward.lse, **grads._asdict()}


def torch_run(q, k, v, options, dout, dlse, sinks, backend):
    leaves = {name: to_torch(a, requires_grad=True) for name, a in (("q", q), ("k", k), ("v", v))}
    if sinks is not None:
        leaves["sinks"] = to_torch(sinks, requires_grad=True)
    extra = {key: to_torch(value) if isinstance(value, np.ndarray) else value
             for key, value in options.items()}  # fmt: skip
    result = varlen_attention(
        leaves["q"], leaves["k"], leaves["v"], to_torch(CU_Q), to_torch(CU_K),
        sinks=leaves.get("sinks"), backend=backend, return_lse=True, **extra,
    )  # fmt: skip
    finite = torch.isfinite(result.lse)  # dead rows: lse -inf, a constant
    upstream = (result.out * to_torch(dout)).sum()
    upstream = upstream + (torch.where(finite, result.lse, 0.0) * to_torch(dlse)).sum()
    upstream.backward()
    values = {"out": result.out, "lse": result.lse}
    for name, leaf in leaves.items():
        values[f"d{name}"] = leaf.grad
    return values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("align", ALIGNS)
def test_matches_the_numpy_twin_forward_and_backward(rng, option, align, backend):
    options, kv_heads = make_options(rng, option, align)
    q, k, v = make_packed(rng, kv_heads)
    sinks = options.pop("sinks", None)
    dout = rng.standard_normal((q.shape[0], q.shape[1], v.shape[2]))
    dlse = rng.standard_normal((q.shape[1], q.shape[0]))
    dlse = np.where(np.isfinite(numpy_run(q, k, v, options, dout, dlse, sinks)["lse"]), dlse, 0)

    expected = numpy_run(q, k, v, options, dout, dlse, sinks)
    actual = torch_run(q, k, v, options, dout, dlse, sinks, backend)

    for name, value in expected.items():
        if value is None:
            continue
        got = to_numpy(actual[name])
        finite = np.isfinite(value)
        assert np.array_equal(np.isfinite(got), finite), name
        assert_close(np.where(finite, got, 0), np.where(finite, value, 0), name=name)


def test_without_return_lse_it_returns_a_tensor_like_attention(rng):
    q, k, v = (to_torch(a) for a in make_packed(rng))

    out = varlen_attention(q, k, v, CU_Q, CU_K, causal=True)

    assert isinstance(out, torch.Tensor) and out.shape == (q.shape[0], q.shape[1], v.shape[2])


def test_half_precision_keeps_its_dtype_with_a_float32_lse(rng):
    q, k, v = (to_torch(a).to(torch.bfloat16) for a in make_packed(rng))

    result = varlen_attention(q, k, v, CU_Q, CU_K, causal=True, return_lse=True)

    assert result.out.dtype == torch.bfloat16 and result.lse.dtype == torch.float32


@pytest.mark.parametrize("case", PACKED_SHAPES)
def test_shape_errors_name_the_packed_shapes_like_numpy(case):
    q_shape, kv_shape, options, match = PACKED_SHAPES[case]
    options = {key: to_torch(value) if isinstance(value, np.ndarray) else value
               for key, value in options.items()}  # fmt: skip
    q, k, v = torch.ones(q_shape), torch.ones(kv_shape), torch.ones(kv_shape)

    with pytest.raises(ValueError, match=match.replace("(H,)", r"\(H,\)")):
        varlen_attention(q, k, v, CU_Q, CU_K, **options)


@pytest.mark.parametrize(("options", "error", "match"), NO_SEQUENCE_BAD_OPTIONS)
def test_options_are_checked_even_without_a_sequence_like_numpy(options, error, match):
    options = {key: to_torch(value) if isinstance(value, np.ndarray) else value
               for key, value in options.items() if key != "impl"}  # fmt: skip
    if not options:
        options = {"backend": "fast"}
        error, match = ValueError, "backend must be one of"
    q, k, v = torch.zeros(0, 4, 3), torch.zeros(0, 4, 3), torch.zeros(0, 4, 2)

    with pytest.raises(error, match=match):
        varlen_attention(q, k, v, [0], [0], **options)


@pytest.mark.parametrize(
    ("cu_q", "match"),
    [
        ([1, 3, 4, 4, 9, 13], "cu_seqlens_q must start at 0"),
        ([0, 4, 3, 8, 13, 13], "cu_seqlens_q must start at 0, never decrease"),
        (np.array([0.0, 3, 4, 4, 9, 13]), "cu_seqlens_q must be an integer tensor"),
    ],
)
def test_bad_offsets_are_refused_naming_them(rng, cu_q, match):
    q, k, v = (to_torch(a) for a in make_packed(rng))

    with pytest.raises((TypeError, ValueError), match=match):
        varlen_attention(q, k, v, cu_q, CU_K)


def test_sdpa_refuses_what_it_cannot_compute_before_any_sequence(rng):
    q, k, v = (to_torch(a) for a in make_packed(rng))

    with pytest.raises(ValueError, match="softcap"):
        varlen_attention(q, k, v, CU_Q, CU_K, softcap=2.0, backend="sdpa")
