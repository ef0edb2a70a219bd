"""What a float64 golden settles in the disputes over Qwen3.5's gated DeltaNet between vLLM and
transformers (vLLM #55792: "transformers has 2 implementations, FLA and native, and native is
wrong"; transformers #46190: a full forward and prefill + decode diverge in bfloat16).
docs/kernel-verification.md, "vLLM #55792", reads the numbers; this file reproduces them:

    python -m pytest tests/parity/test_gdn_disputes.py -s

One tiny random Qwen3.5 text model (hidden 64, 2 key heads of 16 serving 4 value heads of 16,
a 4-tap convolution), its linear-attention layer 0 run on T = 150 tokens: three of transformers'
64-token chunks, so the native chunked path carries its state across chunk edges (the model
tests of test_hf_gated_deltanet.py stay inside one chunk).

1. **The native path's arithmetic.** In float64 (``Float64Math``: transformers' float32 casts
   become float64), the layer's full forward (``torch_chunk_gated_delta_rule``) and a prefill of
   100 tokens then 50 decode steps (``torch_recurrent_gated_delta_rule``, the convolution's
   update) both equal ``GatedDeltaNet``'s float64 recurrence within FLOAT64_RTOL: the native
   implementation computes the right function. Whatever differs between it and fla's kernels in
   bfloat16 is rounding.
2. **Its rounding.** In bfloat16 (weights and input), the full forward and prefill + decode are
   measured against the float64 golden on the same bfloat16 numbers, beside the golden's own
   rounding to bfloat16 (the least any bfloat16 output can be off): both paths within a few
   bfloat16 steps, and within one of each other; the gated RMSNorm in fla's order (no re-cast
   of the normalized value to bfloat16 before the weight, fla's fused norm) measured the same
   way.
3. **A finding on the way**: transformers' torch functions swallow ``cu_seqlens=`` in their
   **kwargs (the layer passes its ``cu_seq_lens_q`` there): packed sequences leak state into
   each other, silently.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from numpy_attention import convert
from numpy_attention.grad_mode import no_grad
from parity_tests.tolerances import FLOAT64_RTOL

from .test_hf_models import Float64Math

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402

T, PREFILL = 150, 100
BF16_STEP = 2.0**-8  # bfloat16's relative rounding step (half an ulp at 1 is 2^-9)
CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "intermediate_size": 32,
    "vocab_size": 11,
    "pad_token_id": None,
    "rms_norm_eps": 1e-6,
}


def _model(dtype: torch.dtype):
    torch.manual_seed(5579)
    text = transformers.Qwen3_5TextConfig(**CONFIG)
    text._attn_implementation = "eager"
    model = transformers.AutoModel.from_config(text).eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if ".linear_attn." in key:  # gates neither 0 nor 1, the norm's weight around 1
                param.normal_(0.0, 1.5 / param.shape[-1] ** 0.5 if param.ndim >= 2 else 0.5)
                if key.endswith("norm.weight"):
                    param.add_(1.0)
    return text, model.to(dtype)


def _runs(text, model, x):
    """transformers' layer 0 on x: the full forward, and prefill then one token at a time."""
    layer = model.layers[0].linear_attn
    with torch.no_grad():
        full = layer(x)
        cache = DynamicCache(config=text)
        steps = [layer(x[:, :PREFILL], cache_params=cache)]
        steps += [layer(x[:, t : t + 1], cache_params=cache) for t in range(PREFILL, T)]
    return layer, full, torch.cat(steps, dim=1)


def _golden(text, model, x) -> np.ndarray:
    """The converted layer in float64 on the model's weights and x exactly as they are."""
    state = {key: value.double().numpy() for key, value in model.state_dict().items()}
    layer = convert.gated_deltanet_from_hf(text.to_dict(), state, 0, form="recurrent")
    with no_grad():
        return layer.astype(np.float64)(x.double().numpy())


def _error(result, gold: np.ndarray) -> float:
    return float(np.max(np.abs(result.double().numpy() - gold)) / np.max(np.abs(gold)))


@pytest.fixture
def float64_default():
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(default)


def test_the_native_path_computes_the_golden_across_chunks_and_decode(float64_default):
    text, model = _model(torch.float64)
    x = torch.randn(1, T, CONFIG["hidden_size"], dtype=torch.float64)
    gold = _golden(text, model, x)

    with Float64Math():
        _, full, decoded = _runs(text, model, x)

    print(f"\nfloat64: full forward {_error(full, gold):.1e}, prefill + decode "
          f"{_error(decoded, gold):.1e} (bound {FLOAT64_RTOL:.0e})")  # fmt: skip
    assert _error(full, gold) < FLOAT64_RTOL
    assert _error(decoded, gold) < FLOAT64_RTOL


def _fla_order(self, hidden_states, gate):
    """The gated RMSNorm without transformers' re-cast to the input dtype before the weight:
    the order of fla's fused norm (transformers' own NOTE above ``Qwen3NextRMSNormGated``)."""
    dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    h = self.weight.to(torch.float32) * h * torch.nn.functional.silu(gate.to(torch.float32))
    return h.to(dtype)


def test_bfloat16_paths_differ_from_the_golden_by_rounding_alone():
    text, model = _model(torch.bfloat16)
    x = torch.randn(1, T, CONFIG["hidden_size"]).to(torch.bfloat16)
    gold = _golden(text, model, x)
    floor = _error(torch.from_numpy(gold).to(torch.bfloat16), gold)  # the output's own rounding

    layer, full, decoded = _runs(text, model, x)
    norm = type(layer.norm)
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, norm, "forward", norm.forward)
        norm.forward = _fla_order
        with torch.no_grad():
            fla_order = layer(x)

    errors = {
        "full forward": _error(full, gold),
        "prefill + decode": _error(decoded, gold),
        "full forward, fla's norm order": _error(fla_order, gold),
    }
    print("\nbfloat16 against the float64 golden (max error / max |golden|): "
          + ", ".join(f"{name} {value:.2e}" for name, value in errors.items())
          + f"; the golden rounded to bfloat16 {floor:.2e}; one step {BF16_STEP:.2e}")  # fmt: skip
    assert floor < BF16_STEP
    for name, value in errors.items():
        assert floor <= value < 4 * BF16_STEP, name  # a few steps: rounding, not a wrong formula
    between = float((full.double() - decoded.double()).abs().max()) / np.max(np.abs(gold))
    assert between <= BF16_STEP  # the two native paths: within one step of each other


@pytest.mark.parametrize(
    "name", ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"]
)
def test_the_native_functions_ignore_cu_seqlens_and_leak_the_state(name):
    """A finding, pinned: transformers' torch gated delta rule takes ``cu_seqlens=`` into its
    **kwargs and drops it (the layer passes its ``cu_seq_lens_q`` there), so a packed batch's
    second sequence starts from the first one's final state instead of 0: silently wrong, where
    the golden (numpy_attention.linear_attention with cu_seqlens) restarts it."""
    import inspect

    from transformers.models.qwen3_next import modeling_qwen3_next

    from numpy_attention.linear_attention import gated_delta_rule_forward

    function = inspect.unwrap(getattr(modeling_qwen3_next, name))  # past the hub-kernel wrapper
    rng = np.random.default_rng(0)
    shape = (1, 20, 2, 8)
    q, k = (rng.standard_normal(shape) for _ in range(2))
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    v, g, beta = (
        rng.standard_normal(shape),
        -rng.uniform(0.02, 0.7, (1, 20, 2)),
        rng.uniform(0.05, 0.95, (1, 20, 2)),
    )
    cu_seqlens = np.array([0, 7, 20])
    golden = gated_delta_rule_forward(q, k, v, g, beta, cu_seqlens=cu_seqlens, form="recurrent").out

    with Float64Math():
        packed, _ = function(*(torch.from_numpy(x) for x in (q, k, v, g, beta)),
                             cu_seqlens=torch.from_numpy(cu_seqlens))  # fmt: skip
        unpacked, _ = function(*(torch.from_numpy(x) for x in (q, k, v, g, beta)))

    assert torch.equal(packed, unpacked)  # cu_seqlens changed nothing
    first, second = slice(0, 7), slice(7, 20)
    np.testing.assert_allclose(packed.numpy()[:, first], golden[:, first], rtol=1e-12, atol=1e-13)
    leak = float(np.max(np.abs(packed.numpy()[:, second] - golden[:, second])))
    assert leak > 1e-2  # the second sequence read the first one's state
