"""numpy_attention.linear_attention: the gated delta rule, KDA and simple GLA, forward against the
recurrence written out per head, every gradient by central differences in float64 (out and the
final state both differentiated), cu_seqlens against the sequences run one by one, fla's naive
recurrent references, and one clear error per bad input. The chunk form against the recurrent
one, and at extreme gates: test_linear_chunk.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import linear_attention as la
from numpy_attention.grad_mode import no_grad
from numpy_attention.gradcheck import gradcheck

from ..conftest import assert_close, assert_gradcheck, to_numpy, to_torch

B, T, H, K, V = 2, 7, 2, 4, 3
VARIANTS = {
    "gated_delta_rule": (la.gated_delta_rule_forward, la.gated_delta_rule_backward),
    "kda": (la.kda_forward, la.kda_backward),
    "simple_gla": (la.simple_gla_forward, la.simple_gla_backward),
}
FORMS = ("recurrent", "chunk")
CU_SEQLENS = np.array([0, 4, 5, 5, 13])  # a one-token and an empty sequence among them
CU_SMALL = np.array([0, 3, 4, 4, 7])  # the same kinds, for central differences


def inputs(rng, variant, batch=B, tokens=T, dtype=np.float64, gate=None):
    """q, k, v, g (and beta) as the layers make them: L2-normed keys, beta in (0, 1), log gates
    below 0 (``gate`` fixes every g instead)."""
    q = rng.standard_normal((batch, tokens, H, K))
    k = rng.standard_normal((batch, tokens, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((batch, tokens, H, V))
    g_shape = (batch, tokens, H, K) if variant == "kda" else (batch, tokens, H)
    g = -rng.uniform(0.02, 0.7, g_shape) if gate is None else np.full(g_shape, gate)
    arrays = [q, k, v, g]
    if variant != "simple_gla":
        arrays.append(rng.uniform(0.05, 0.95, (batch, tokens, H)))
    return [a.astype(dtype) for a in arrays]


def recurrence(q, k, v, g, beta=None, *, scale=None, initial_state=None):
    """The contract's recurrence, one (batch, head) and one token at a time: P = diag(exp(g)) S,
    S = P + beta k (v - P^T k)^T (or P + k v^T without beta), o = scale S^T q."""
    batch, tokens, heads, width = q.shape
    scale = width**-0.5 if scale is None else scale
    out = np.zeros(v.shape)
    final = np.zeros((batch, heads, width, v.shape[-1]))
    for b in range(batch):
        for h in range(heads):
            s = np.zeros((width, v.shape[-1])) if initial_state is None else initial_state[b, h]
            for t in range(tokens):
                p = np.exp(np.atleast_1d(g[b, t, h]))[:, None] * s
                if beta is None:
                    s = p + np.outer(k[b, t, h], v[b, t, h])
                else:
                    s = p + beta[b, t, h] * np.outer(k[b, t, h], v[b, t, h] - p.T @ k[b, t, h])
                out[b, t, h] = scale * s.T @ q[b, t, h]
            final[b, h] = s
    return out, final


def state(rng, n=B):
    return rng.standard_normal((n, H, K, V))


def run(variant, arrays, **kwargs):
    return VARIANTS[variant][0](*arrays, **kwargs)


def grads_of(variant, res, dout, dfinal=None):
    return VARIANTS[variant][1](dout, res.ctx, dfinal)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("with_state", [False, True])
def test_forward_is_the_recurrence(rng, variant, form, with_state):
    arrays = inputs(rng, variant)
    s0 = state(rng) if with_state else None

    res = run(variant, arrays, scale=0.7, initial_state=s0, output_final_state=True, form=form,
              chunk_size=3)  # fmt: skip

    out, final = recurrence(*arrays, scale=0.7, initial_state=s0)
    assert_close(res.out, out, name="out")
    assert_close(res.final_state, final, name="final_state")


def differentiable(variant, n_inputs, **kwargs):
    """A forward whose one output is out and the final state, flattened together, and its
    backward: so that central differences reach every input through both."""

    def forward(*args):
        arrays, s0 = list(args[:n_inputs]), args[n_inputs]
        res = run(variant, arrays, initial_state=s0, output_final_state=True, **kwargs)
        forward.shapes = res.out.shape, res.final_state.shape
        return np.concatenate([res.out.ravel(), res.final_state.ravel()]), res.ctx

    def backward(dall, ctx):
        out_shape, final_shape = forward.shapes
        split = int(np.prod(out_shape))
        dout, dfinal = dall[:split].reshape(out_shape), dall[split:].reshape(final_shape)
        return tuple(VARIANTS[variant][1](dout, ctx, dfinal))

    return forward, backward


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("varlen", [False, True])
def test_gradcheck(rng, variant, form, varlen):
    """q, k, v, g, beta and initial_state by central differences, through out and final_state;
    chunks of 3 over 7 tokens (a partial last chunk), or packed sequences of 3, 1, 0, 3 tokens."""
    if varlen:
        arrays, s0 = inputs(rng, variant, batch=1), state(rng, len(CU_SMALL) - 1)
        kwargs = {"cu_seqlens": CU_SMALL}
    else:
        arrays, s0 = inputs(rng, variant), state(rng)
        kwargs = {}
    forward, backward = differentiable(variant, len(arrays), form=form, chunk_size=3, **kwargs)

    assert_gradcheck(gradcheck(forward, *arrays, s0, backward=backward))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("form", FORMS)
def test_cu_seqlens_equals_the_sequences_run_alone(rng, variant, form):
    """Each packed sequence from its own initial state: its outputs, its final state and its
    gradients are those of a call on it alone; an empty sequence passes its state through."""
    arrays = inputs(rng, variant, batch=1, tokens=13)
    s0 = state(rng, len(CU_SEQLENS) - 1)
    dout, dfinal = rng.standard_normal((1, 13, H, V)), rng.standard_normal(s0.shape)

    packed = run(variant, arrays, initial_state=s0, output_final_state=True, form=form,
                 cu_seqlens=CU_SEQLENS, chunk_size=3)  # fmt: skip
    grads = grads_of(variant, packed, dout, dfinal)

    for n, (start, stop) in enumerate(zip(CU_SEQLENS[:-1], CU_SEQLENS[1:], strict=True)):
        piece = [a[:, start:stop] for a in arrays]
        alone = run(variant, piece, initial_state=s0[n : n + 1], output_final_state=True,
                    form=form, chunk_size=3)  # fmt: skip
        alone_grads = grads_of(variant, alone, dout[:, start:stop], dfinal[n : n + 1])
        assert_close(packed.out[:, start:stop], alone.out, name=f"out of sequence {n}")
        assert_close(packed.final_state[n : n + 1], alone.final_state, name=f"final {n}")
        for name, got, want in zip(la.LinearGrads._fields, grads, alone_grads, strict=True):
            if got is None:
                continue
            got = got[n : n + 1] if name == "dinitial_state" else got[:, start:stop]
            assert_close(got, want, name=f"{name} of sequence {n}")
    assert np.array_equal(packed.final_state[2], s0[2])  # the empty sequence


def fla_reference(variant):
    """fla's naive recurrent reference of the variant, called with our argument names."""
    if variant == "gated_delta_rule":
        naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
        return lambda q, k, v, g, beta, **kw: naive.naive_recurrent_gated_delta_rule(
            q, k, v, beta=beta, g=g, **kw
        )
    if variant == "kda":
        return pytest.importorskip("fla.ops.kda.naive").naive_recurrent_kda
    return pytest.importorskip("fla.ops.simple_gla.naive").naive_recurrent_simple_gla


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("form", FORMS)
def test_against_fla_naive_recurrent(rng, variant, form):
    """fla's naive references upcast everything to float32 inside: out, the final state and
    every gradient (torch autograd through the reference) judged at float32's tolerance."""
    pytest.importorskip("torch")
    reference = fla_reference(variant)
    arrays = inputs(rng, variant, tokens=37)
    s0 = state(rng)
    dout, dfinal = rng.standard_normal((B, 37, H, V)), rng.standard_normal(s0.shape)
    ours = run(variant, arrays, initial_state=s0, output_final_state=True, form=form,
               chunk_size=16)  # fmt: skip
    our_grads = grads_of(variant, ours, dout, dfinal)

    leaves = [to_torch(a, requires_grad=True) for a in [*arrays, s0]]
    names = dict(zip(["q", "k", "v", "g", "beta"], leaves[:-1], strict=False))
    out, final = reference(**names, initial_state=leaves[-1], output_final_state=True)
    loss = (out.double() * to_torch(dout)).sum() + (final.double() * to_torch(dfinal)).sum()
    loss.backward()

    assert_close(ours.out, to_numpy(out).astype(np.float64), dtype=np.float32, name="out")
    assert_close(ours.final_state, to_numpy(final), dtype=np.float32, name="final_state")
    theirs = [to_numpy(leaf.grad) for leaf in leaves]
    for name, got in our_grads._asdict().items():
        if got is not None:
            assert_close(got, theirs.pop(0), dtype=np.float32, name=name)


def test_float16_is_computed_in_float32_and_the_state_stays_there(rng):
    arrays = inputs(rng, "gated_delta_rule", dtype=np.float16)

    res = la.gated_delta_rule_forward(*arrays, output_final_state=True, form="recurrent")

    out, final = recurrence(*(a.astype(np.float64) for a in arrays))
    assert res.out.dtype == np.float16 and res.final_state.dtype == np.float32
    assert_close(res.out, out.astype(np.float16), dtype=np.float16, name="out")
    assert_close(res.final_state, final, dtype=np.float32, name="final_state")


def test_no_grad_keeps_no_ctx_and_a_ctx_is_for_its_own_variant(rng):
    arrays = inputs(rng, "gated_delta_rule")
    with no_grad():
        assert la.gated_delta_rule_forward(*arrays).ctx is None
    res = la.gated_delta_rule_forward(*arrays)
    dout = np.zeros((B, T, H, V))

    with pytest.raises(TypeError, match="kda_backward needs the ctx of a kda_forward"):
        la.kda_backward(dout, res.ctx)
    with pytest.raises(TypeError, match="outside no_grad"):
        la.gated_delta_rule_backward(dout, None)
    with pytest.raises(ValueError, match="did not output final_state"):
        la.gated_delta_rule_backward(dout, res.ctx, np.zeros((B, H, K, V)))
    with pytest.raises(ValueError, match="dfinal_state must have the output's shape"):
        res = la.gated_delta_rule_forward(*arrays, output_final_state=True)
        la.gated_delta_rule_backward(dout, res.ctx, np.zeros((B, H, K, V + 1)))


def bad(rng, case):
    """The arguments of one gated delta rule call with one thing wrong, by case name."""
    q, k, v, g, beta = inputs(rng, "gated_delta_rule", batch=1, tokens=5)
    kwargs = {}
    if case == "k_heads":
        k = k[:, :, :1]
    elif case == "k_width":
        k = k[..., :3]
    elif case == "v_tokens":
        v = v[:, :4]
    elif case == "v_rank":
        v = v[0]
    elif case == "g_per_channel":
        g = np.zeros((1, 5, H, K))
    elif case == "beta_batch":
        beta = np.concatenate([beta, beta])
    elif case == "dtype":
        beta = beta.astype(np.float32)
    elif case == "int":
        q = q.astype(np.int64)
    elif case == "form":
        kwargs["form"] = "parallel"
    elif case == "chunk_size":
        kwargs["chunk_size"] = 0
    elif case == "chunk_size_type":
        kwargs["chunk_size"] = 4.0
    elif case == "state_shape":
        kwargs["initial_state"] = np.zeros((1, H, V, K))
    elif case == "state_per_sequence":
        kwargs |= {"cu_seqlens": np.array([0, 2, 5]), "initial_state": np.zeros((1, H, K, V))}
    elif case == "cu_batch":
        q, k, v, g, beta = (np.concatenate([a, a]) for a in (q, k, v, g, beta))
        kwargs["cu_seqlens"] = np.array([0, 2, 5])
    elif case == "cu_start":
        kwargs["cu_seqlens"] = np.array([1, 2, 5])
    elif case == "cu_end":
        kwargs["cu_seqlens"] = np.array([0, 2, 4])
    elif case == "cu_decreasing":
        kwargs["cu_seqlens"] = np.array([0, 3, 2, 5])
    elif case == "cu_float":
        kwargs["cu_seqlens"] = np.array([0.0, 5.0])
    elif case == "scale":
        kwargs["scale"] = float("nan")
    elif case == "flag":
        kwargs["output_final_state"] = "yes"
    return (q, k, v, g, beta), kwargs


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("k_heads", ValueError, r"q and k must both be \(B, T, H, K\)"),
        ("k_width", ValueError, r"q and k must both be \(B, T, H, K\)"),
        ("v_tokens", ValueError, r"v must be \(B, T, H, V\) with q's"),
        ("v_rank", ValueError, r"v must be \(B, T, H, width\)"),
        ("g_per_channel", ValueError, "a gate per key channel is KDA: kda_forward"),
        ("beta_batch", ValueError, r"beta must be \(B, T, H\)"),
        ("dtype", TypeError, "inputs must share one dtype"),
        ("int", TypeError, "q must be a floating-point array"),
        ("form", ValueError, "form must be 'recurrent' or 'chunk', got 'parallel'"),
        ("chunk_size", ValueError, "chunk_size must be a positive int"),
        ("chunk_size_type", TypeError, "chunk_size must be an int"),
        ("state_shape", ValueError, r"initial_state must be \(N, H, K, V\)"),
        ("state_per_sequence", ValueError, "N the sequences of cu_seqlens"),
        ("cu_batch", ValueError, "B must be 1"),
        ("cu_start", ValueError, "cu_seqlens must start at 0"),
        ("cu_end", ValueError, "cu_seqlens must end at T = 5"),
        ("cu_decreasing", ValueError, "cu_seqlens must never decrease"),
        ("cu_float", TypeError, "cu_seqlens must be an integer array"),
        ("scale", ValueError, "scale must be finite"),
        ("flag", TypeError, "output_final_state must be a bool"),
    ],
)
def test_bad_input_is_one_clear_error(rng, case, error, message):
    arrays, kwargs = bad(rng, case)

    with pytest.raises(error, match=message):
        la.gated_delta_rule_forward(*arrays, **kwargs)


@pytest.mark.parametrize(
    ("variant", "g_shape", "message"),
    [("kda", (1, 5, H), r"g must be \(B, T, H, K\)"), ("simple_gla", (1, 5, H, K), "g must be")],
)
def test_the_gate_shape_of_each_variant(rng, variant, g_shape, message):
    q, k, v, _, *beta = inputs(rng, variant, batch=1, tokens=5)

    with pytest.raises(ValueError, match=message):
        run(variant, [q, k, v, np.zeros(g_shape), *beta])
