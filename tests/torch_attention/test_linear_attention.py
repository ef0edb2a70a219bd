"""torch_attention.linear_attention: the recurrent and chunked forms against each other (out, final
state and every autograd gradient, float64), packed sequences against separate calls, against
flash-linear-attention's naive references and transformers' torch fallbacks (both compute in
float32), gates at the extremes, half precision with a float32 state, and the refusals."""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest
import torch

from parity_tests.tolerances import rel_error
from torch_attention.linear_attention import gated_delta_rule, kda, simple_gla

from ..conftest import assert_close, to_numpy, to_torch

H, K, V = 2, 4, 6  # K != V
CHUNK = 16
# DESIGN.md, "Linear attention": the two forms are equal in float64 to 1e-12 (measured ~1e-15).
FORMS_RTOL = 1e-12

VARIANTS = {  # name: (function, gate per key channel, delta rule: takes beta)
    "gated_delta_rule": (gated_delta_rule, False, True),
    "kda": (kda, True, True),
    "simple_gla": (simple_gla, False, False),
}


def inputs(rng, variant, batch, length, sequences=None, gate=None):
    """float64 arrays by name: q, k (L2-normalized, as fla's layers feed them), v, log-gates g
    (random in [-0.5, 0) unless ``gate`` fixes them), beta in (0, 1) for the delta rules, and an
    initial state (N, H, K, V), N = ``sequences`` or ``batch``."""
    _, per_channel, delta = VARIANTS[variant]
    k = rng.standard_normal((batch, length, H, K))
    arrays = {
        "q": rng.standard_normal((batch, length, H, K)),
        "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
        "v": rng.standard_normal((batch, length, H, V)),
    }
    gate_shape = (batch, length, H) + ((K,) if per_channel else ())
    arrays["g"] = -rng.uniform(0.0, 0.5, gate_shape) if gate is None else np.full(gate_shape, gate)
    if delta:
        arrays["beta"] = rng.uniform(0.0, 1.0, (batch, length, H))
    arrays["initial_state"] = rng.standard_normal((sequences or batch, H, K, V))
    return arrays


def call(variant, tensors, **options):
    """``variant`` on tensors by name (``inputs``' names; ``initial_state`` optional)."""
    function, _, delta = VARIANTS[variant]
    names = ("q", "k", "v", "g", "beta") if delta else ("q", "k", "v", "g")
    return function(
        *(tensors[n] for n in names), initial_state=tensors.get("initial_state"), **options
    )


def run_with_grads(variant, arrays, rng, form, chunk_size=CHUNK, **options):
    """out, final state and the gradient of every input by name, under random upstream
    gradients (drawn from ``rng`` so that both forms see the same ones)."""
    tensors = {n: to_torch(a, requires_grad=True) for n, a in arrays.items()}
    res = call(
        variant, tensors, output_final_state=True, form=form, chunk_size=chunk_size, **options
    )
    dout = to_torch(rng.standard_normal(res.out.shape))
    dstate = to_torch(rng.standard_normal(res.final_state.shape))
    loss = (res.out * dout).sum() + (res.final_state * dstate).sum()
    grads = torch.autograd.grad(loss, list(tensors.values()))
    named = {"out": res.out, "final_state": res.final_state}
    named |= {f"d{n}": grad for n, grad in zip(tensors, grads, strict=True)}
    return {n: to_numpy(t) for n, t in named.items()}


def assert_forms_equal(recurrent, chunk, *, dg_floor=False):
    """Every tensor of the two forms within FORMS_RTOL, each on its own scale. ``dg_floor``: the
    caller says dg is structurally zero or tiny; the chunked form computes dg as a reverse
    cumulative sum of terms the size of dk's entries that cancel, so its rounding is judged on
    dk's scale there."""
    for name, expected in recurrent.items():
        floor = float(np.max(np.abs(recurrent["dk"]))) if dg_floor and name == "dg" else 0.0
        error = rel_error(chunk[name], expected, scale=floor)
        assert error <= FORMS_RTOL, f"{name}: recurrent vs chunk {error:.2e} > {FORMS_RTOL:.0e}"


LAYOUTS = {  # id: (B, T, cu_seqlens)
    "one-token": (2, 1, None),
    "T=33": (2, 33, None),
    "T=70": (2, 70, None),
    "packed": (1, 70, [0, 1, 37, 37, 70]),  # a one-token and an empty sequence
}


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_recurrent_equals_chunk(rng, variant, layout, with_state):
    batch, length, offsets = LAYOUTS[layout]
    sequences = None if offsets is None else len(offsets) - 1
    arrays = inputs(rng, variant, batch, length, sequences)
    if not with_state:
        del arrays["initial_state"]
    options = {} if offsets is None else {"cu_seqlens": torch.tensor(offsets)}
    seed = int(rng.integers(1 << 31))
    recurrent = run_with_grads(variant, arrays, np.random.default_rng(seed), "recurrent", **options)
    chunk = run_with_grads(variant, arrays, np.random.default_rng(seed), "chunk", **options)
    # One token from a zero state: dg is structurally zero (a_1 multiplies S_0 = 0).
    assert_forms_equal(recurrent, chunk, dg_floor=length == 1 and not with_state)


@pytest.mark.parametrize("form", ["recurrent", "chunk"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_sequences_equal_separate_calls(rng, variant, form):
    offsets = [0, 1, 20, 20, 45]  # a one-token and an empty sequence; 19 and 25 cross chunks
    arrays = {n: to_torch(a) for n, a in inputs(rng, variant, 1, 45, sequences=4).items()}
    packed = call(
        variant,
        arrays,
        cu_seqlens=torch.tensor(offsets),
        output_final_state=True,
        form=form,
        chunk_size=CHUNK,
    )
    for n, (start, stop) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
        one = {name: a[:, start:stop] for name, a in arrays.items() if name != "initial_state"}
        one["initial_state"] = arrays["initial_state"][n : n + 1]
        alone = call(variant, one, output_final_state=True, form=form, chunk_size=CHUNK)
        assert_close(packed.out[:, start:stop], alone.out, name=f"out of sequence {n}")
        assert_close(packed.final_state[n : n + 1], alone.final_state, name=f"state {n}")


def _fla_references():
    """fla-core's naive references, each adapted to (q, k, v, g, beta, scale, state) in float32
    (beta None for simple GLA): ``naive_recurrent_gated_delta_rule`` takes beta before g."""
    gdr = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    kda_naive = pytest.importorskip("fla.ops.kda.naive")
    gla = pytest.importorskip("fla.ops.simple_gla.naive")
    final = {"output_final_state": True}
    return {
        "naive_recurrent_gated_delta_rule": lambda q, k, v, g, beta, scale, s: (
            gdr.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale, s, **final)
        ),
        "naive_chunk_gated_delta_rule": lambda q, k, v, g, beta, scale, s: (
            gdr.naive_chunk_gated_delta_rule(q, k, v, g, beta, CHUNK, scale, s, **final)
        ),
        "naive_recurrent_kda": lambda q, k, v, g, beta, scale, s: kda_naive.naive_recurrent_kda(
            q, k, v, g, beta, scale, s, **final
        ),
        "naive_chunk_kda": lambda q, k, v, g, beta, scale, s: kda_naive.naive_chunk_kda(
            q, k, v, g, beta, scale, s, chunk_size=CHUNK, **final
        ),
        "naive_recurrent_simple_gla": lambda q, k, v, g, beta, scale, s: (
            gla.naive_recurrent_simple_gla(q, k, v, g, scale, s, **final)
        ),
        "naive_chunk_simple_gla": lambda q, k, v, g, beta, scale, s: gla.naive_chunk_simple_gla(
            q, k, v, g, s, chunk_size=CHUNK, scale=scale, **final
        ),
    }


@pytest.mark.parametrize(
    "reference",
    [f"naive_{form}_{variant}" for variant in VARIANTS for form in ("recurrent", "chunk")],
)
def test_fla_naive_references(rng, reference):
    variant = reference.split("_", 2)[2]
    fla_reference = _fla_references()[reference]
    arrays = inputs(rng, variant, 2, 4 * CHUNK)  # naive_chunk_kda needs T a multiple of C
    ours = call(
        variant, {n: to_torch(a) for n, a in arrays.items()}, scale=0.3, output_final_state=True
    )
    single = {n: to_torch(a).float() for n, a in arrays.items()}  # fla computes in float32
    out, state = fla_reference(
        single["q"],
        single["k"],
        single["v"],
        single["g"],
        single.get("beta"),
        0.3,
        single["initial_state"],
    )
    assert_close(out.double(), ours.out, dtype=np.float32, name=f"{reference} out")
    assert_close(state.double(), ours.final_state, dtype=np.float32, name=f"{reference} state")


def _transformers_torch_path(module_name, function_name):
    """The torch code of a transformers fallback: with fla installed the public name calls fla's
    kernel (``use_kernel_func_from_hub_with_fallback``); ``inspect.unwrap`` finds the torch
    function under the wrapper."""
    module = pytest.importorskip(f"transformers.models.{module_name}")
    return inspect.unwrap(getattr(module, function_name))


TRANSFORMERS = {  # id: (module, function, variant, takes chunk_size)
    "torch_recurrent_gated_delta_rule": (
        "qwen3_next.modeling_qwen3_next",
        "torch_recurrent_gated_delta_rule",
        "gated_delta_rule",
        False,
    ),
    "torch_chunk_gated_delta_rule": (
        "qwen3_next.modeling_qwen3_next",
        "torch_chunk_gated_delta_rule",
        "gated_delta_rule",
        True,
    ),
    "recurrent_kimi_delta_attention": (
        "kimi_linear.modeling_kimi_linear",
        "recurrent_kimi_delta_attention",
        "kda",
        False,
    ),
    "chunk_kimi_delta_attention": (
        "kimi_linear.modeling_kimi_linear",
        "chunk_kimi_delta_attention",
        "kda",
        True,
    ),
}


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_torch_fallbacks(rng, name):
    module_name, function_name, variant, chunked = TRANSFORMERS[name]
    fallback = _transformers_torch_path(module_name, function_name)
    arrays = inputs(rng, variant, 2, 70)  # T across two of their 64-token chunks
    ours = call(variant, {n: to_torch(a) for n, a in arrays.items()}, output_final_state=True)
    single = {n: to_torch(a).float() for n, a in arrays.items()}  # they compute in float32
    options = {"chunk_size": CHUNK} if chunked else {}
    out, state = fallback(
        single["q"],
        single["k"],
        single["v"],
        single["g"],
        single["beta"],
        initial_state=single["initial_state"],
        output_final_state=True,
        **options,
    )
    assert_close(out.double(), ours.out, dtype=np.float32, name=f"{name} out")
    assert_close(state.double(), ours.final_state, dtype=np.float32, name=f"{name} state")


def test_transformers_without_fla_drops_scale_and_refuses_cu_seqlens(rng, monkeypatch):
    """What the module docstring says of transformers' fallback when fla is absent: the wrapper
    (integrations/hub_kernels.py) drops ``scale=`` (the torch path scales by K^-0.5) and raises
    on ``cu_seqlens``. The wrapper is rebuilt here around the torch path with fla unimportable."""
    hub_kernels = pytest.importorskip("transformers.integrations.hub_kernels")
    torch_path = _transformers_torch_path(
        "qwen3_next.modeling_qwen3_next", "torch_chunk_gated_delta_rule"
    )
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla raises ImportError
    wrapped = hub_kernels.use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule", "fla")(
        torch_path
    )
    arrays = inputs(rng, "gated_delta_rule", 1, 20)
    single = {n: to_torch(a).float() for n, a in arrays.items()}
    args = [single[n] for n in ("q", "k", "v", "g", "beta")]
    default = call("gated_delta_rule", {n: to_torch(a) for n, a in arrays.items()})
    out, _ = wrapped(*args, initial_state=single["initial_state"], scale=0.3)
    assert_close(out.double(), default.out, dtype=np.float32, name="out with scale=0.3 dropped")
    with pytest.raises(ValueError, match="packed sequences"):
        wrapped(*args, cu_seqlens=torch.tensor([0, 5, 20]))


@pytest.mark.parametrize("gate", [-1e-9, -20.0], ids=["gate->1", "gate=-20"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gates_at_the_extremes_stay_finite(rng, variant, gate):
    arrays = inputs(rng, variant, 2, 70, gate=gate)
    seed = int(rng.integers(1 << 31))
    recurrent = run_with_grads(variant, arrays, np.random.default_rng(seed), "recurrent")
    # fla's 64-token chunks: G_i - G_j reaches 20 * 63 = 1260 > log(float64 max) = 709.8
    chunk = run_with_grads(variant, arrays, np.random.default_rng(seed), "chunk", chunk_size=64)
    for name, value in chunk.items():
        assert np.all(np.isfinite(value)), f"{name} is not finite in the chunked form"
    # At g = -20, dg is exp(-20) ~ 2e-9 times O(1) terms: structurally small.
    assert_forms_equal(recurrent, chunk, dg_floor=gate == -20.0)


@pytest.mark.parametrize("form", ["recurrent", "chunk"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", VARIANTS)
def test_half_inputs_keep_a_float32_state(rng, variant, dtype, form):
    arrays = inputs(rng, variant, 2, 70)
    half = {n: to_torch(a).to(dtype) for n, a in arrays.items() if n != "initial_state"}
    half["initial_state"] = to_torch(arrays["initial_state"]).float()
    res = call(variant, half, output_final_state=True, form=form, chunk_size=CHUNK)
    single = call(
        variant,
        {n: t.float() for n, t in half.items()},
        output_final_state=True,
        form=form,
        chunk_size=CHUNK,
    )
    golden = call(variant, {n: t.double() for n, t in half.items()}, output_final_state=True)
    assert res.out.dtype == dtype and res.final_state.dtype == torch.float32
    # Computed in float32 throughout: the float32 answer on the same inputs, rounded once.
    assert torch.equal(res.out, single.out.to(dtype))
    assert torch.equal(res.final_state, single.final_state)
    assert_close(single.out.double(), golden.out, dtype=np.float32, name="float32 out")
    assert_close(res.final_state.double(), golden.final_state, dtype=np.float32, name="state")
    if dtype == torch.float16:
        assert_close(res.out.double(), golden.out, dtype=np.float16, name="float16 out")
    else:  # no suite tolerance for bfloat16: one rounding moves an entry by <= eps / 2
        error = rel_error(to_numpy(res.out.double()), to_numpy(golden.out))
        assert error <= torch.finfo(dtype).eps, f"bfloat16 out: relative error {error:.2e}"


def test_no_final_state_unless_asked(rng):
    arrays = {n: to_torch(a) for n, a in inputs(rng, "gated_delta_rule", 2, 5).items()}
    assert call("gated_delta_rule", arrays).final_state is None


BAD = {  # id: (variant, change to the inputs and options, error, message)
    "q 3-D": ("gated_delta_rule", lambda a: {"q": a["q"][0]}, ValueError, r"q must be \(B, T, H"),
    "k shorter": ("gated_delta_rule", lambda a: {"k": a["k"][:, 1:]}, ValueError, "q and k"),
    "k narrower": ("gated_delta_rule", lambda a: {"k": a["k"][..., 1:]}, ValueError, "q and k"),
    "v heads": ("gated_delta_rule", lambda a: {"v": a["v"][:, :, 1:]}, ValueError, "v must be"),
    "K = 0": (
        "gated_delta_rule",
        lambda a: {"q": a["q"][..., :0], "k": a["k"][..., :0], "initial_state": None},
        ValueError,
        "K = 0",
    ),
    "g per channel": (
        "gated_delta_rule",
        lambda a: {"g": a["g"][..., None].expand(-1, -1, -1, K)},
        ValueError,
        "g must be",
    ),
    "kda g per head": ("kda", lambda a: {"g": a["g"][..., 0]}, ValueError, "g must be"),
    "g batch": ("simple_gla", lambda a: {"g": a["g"][:1]}, ValueError, "g must be"),
    "beta length": (
        "gated_delta_rule",
        lambda a: {"beta": a["beta"][:, 1:]},
        ValueError,
        "beta must be",
    ),
    "v float32": ("gated_delta_rule", lambda a: {"v": a["v"].float()}, TypeError, "one dtype"),
    "g integer": ("gated_delta_rule", lambda a: {"g": a["g"].long()}, TypeError, "g must be"),
    "state N": (
        "gated_delta_rule",
        lambda a: {"initial_state": a["initial_state"][:1]},
        ValueError,
        "initial_state must be",
    ),
    "state K V swapped": (
        "kda",
        lambda a: {"initial_state": a["initial_state"].mT},
        ValueError,
        "initial_state must be",
    ),
    "form": ("gated_delta_rule", lambda a: {"form": "parallel"}, ValueError, "form must be"),
    "chunk_size 0": ("gated_delta_rule", lambda a: {"chunk_size": 0}, ValueError, "chunk_size"),
    "scale nan": ("simple_gla", lambda a: {"scale": float("nan")}, ValueError, "scale"),
    "B = 2 packed": (
        "gated_delta_rule",
        lambda a: {"cu_seqlens": torch.tensor([0, 3, 7])},
        ValueError,
        "B must be 1",
    ),
}
PACKED_BAD = {  # id: (cu_seqlens, T, error, message), for B = 1 and T tokens
    "not from 0": ([1, 4, 7], 7, ValueError, "start at 0"),
    "decreasing": ([0, 5, 3, 7], 7, ValueError, "never decrease"),
    "not to T": ([0, 3, 6], 7, ValueError, "end at the packed length 7"),
    "float": ([0.0, 7.0], 7, TypeError, "integer"),
    "no sequence": ([0], 0, ValueError, "at least one sequence"),
    "state per sequence": ([0, 3, 7], 7, ValueError, "initial_state must be"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input(rng, case):
    variant, change, error, message = BAD[case]
    arrays = {n: to_torch(a) for n, a in inputs(rng, variant, 2, 7).items()}
    options = change(arrays)
    tensors = arrays | {n: options.pop(n) for n in list(options) if n in arrays}
    with pytest.raises(error, match=message):
        call(variant, tensors, **options)


@pytest.mark.parametrize("case", PACKED_BAD)
def test_bad_cu_seqlens(rng, case):
    offsets, length, error, message = PACKED_BAD[case]
    arrays = {n: to_torch(a) for n, a in inputs(rng, "gated_delta_rule", 1, length).items()}
    if case != "state per sequence":
        del arrays["initial_state"]
    with pytest.raises(error, match=message):
        call("gated_delta_rule", arrays, cu_seqlens=torch.tensor(offsets))
