"""Every weight layout, proven end to end: a real torch module on one side, the NumPy layer loaded
through ``numpy_attention.convert`` on the other; outputs, input gradients, and the torch
module's parameter gradients mapped through the same converter, all in float64.

PyTorch's own ``nn.MultiheadAttention`` and transformers' ``GPT2Attention`` serve as oracles.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention as na
import numpy_attention.fused as na_fused
import torch_attention as ta
from numpy_attention import convert
from parity_tests.tolerances import structural_floors

from ..conftest import assert_close, to_numpy, to_torch

C, H, N, M, CTX = 8, 2, 7, 5, 16


def torch_grads(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: to_numpy(param.grad) for name, param in module.named_parameters()}


def check_transfer(np_layer, np_args, np_kwargs, torch_out, torch_inputs, mapped_grads, dout):
    """Run the NumPy layer, backpropagate both sides, compare everything by name."""
    out = np_layer(*np_args, **np_kwargs)
    input_grads = np_layer.backward(dout)
    input_grads = input_grads if isinstance(input_grads, tuple) else (input_grads,)

    ours = np_layer.named_grads()
    # Each tensor on its own scale; the key bias's gradient is structurally zero (each row of dS
    # sums to 0) and is judged on its projection's weight gradient (tolerances.structural_floors).
    floors = structural_floors(ours, one_key=False)
    assert_close(out, torch_out, name="out")
    for index, (grad, tensor) in enumerate(zip(input_grads, torch_inputs, strict=True)):
        assert_close(grad, tensor.grad, name=f"input {index}")
    for name, grad in mapped_grads.items():
        assert_close(ours[name], grad, name=f"d[{name}]", scale=floors.get(name, 0.0))


def padding_mask(rng, batch, length):
    mask = rng.random((batch, length)) < 0.3
    mask[:, 0] = False
    mask[-1] = True  # a fully padded batch element
    return mask


def test_v2_to_v1_the_books_transfer(rng):
    torch.manual_seed(789)
    v2 = ta.SelfAttentionV2(3, 4).double()
    v1 = na.SelfAttentionV1(3, 4).astype(np.float64)
    v1.load_state_dict(convert.v1_from_v2(ta.to_numpy(v2)))
    x = rng.standard_normal((2, N, 3))
    dout = rng.standard_normal((2, N, 4))
    tx = to_torch(x, requires_grad=True)

    torch_out = v2(tx)
    torch_out.backward(to_torch(dout))

    check_transfer(v1, (x,), {}, torch_out, (tx,), convert.v1_from_v2(torch_grads(v2)), dout)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_wrapper_to_multi_head(rng, qkv_bias):
    torch.manual_seed(123)
    wrapper = ta.MultiHeadAttentionWrapper(3, 4, CTX, 0.0, H, qkv_bias).double().eval()
    mha = na.MultiHeadAttention(3, 4 * H, CTX, 0.0, H, qkv_bias).astype(np.float64).eval()
    mha.load_state_dict(convert.mha_from_wrapper(ta.to_numpy(wrapper), H))
    x = rng.standard_normal((2, N, 3))
    dout = rng.standard_normal((2, N, 4 * H))
    tx = to_torch(x, requires_grad=True)

    torch_out = wrapper(tx)
    torch_out.backward(to_torch(dout))

    # out_proj is the identity the converter inserts: it has no counterpart in the wrapper.
    mapped = convert.mha_from_wrapper(torch_grads(wrapper), H)
    mapped = {name: grad for name, grad in mapped.items() if not name.startswith("out_proj")}
    assert set(mapped) >= {"W_query.weight", "W_key.weight", "W_value.weight"}
    check_transfer(mha, (x,), {}, torch_out, (tx,), mapped, dout)


def test_separate_to_fused(rng):
    torch.manual_seed(0)
    book = ta.MultiHeadAttention(C, C, CTX, 0.0, H, qkv_bias=True).double().eval()
    fused = na_fused.CausalSelfAttention(C, H, CTX).astype(np.float64).eval()
    fused.load_state_dict(convert.fused_from_separate(ta.to_numpy(book)))
    x = rng.standard_normal((2, N, C))
    dout = rng.standard_normal((2, N, C))
    tx = to_torch(x, requires_grad=True)

    torch_out = book(tx)
    torch_out.backward(to_torch(dout))

    mapped = convert.fused_from_separate(torch_grads(book))
    check_transfer(fused, (x,), {}, torch_out, (tx,), mapped, dout)


def test_fused_to_separate(rng):
    torch.manual_seed(1)
    fused = ta.CausalSelfAttention(C, H, CTX).double().eval()
    book = na.MultiHeadAttention(C, C, CTX, 0.0, H, qkv_bias=True).astype(np.float64).eval()
    book.load_state_dict(convert.separate_from_fused(ta.to_numpy(fused), context_length=CTX))
    x = rng.standard_normal((2, N, C))
    dout = rng.standard_normal((2, N, C))
    tx = to_torch(x, requires_grad=True)

    torch_out = fused(tx)
    torch_out.backward(to_torch(dout))

    mapped = convert.separate_from_fused(torch_grads(fused))
    check_transfer(book, (x,), {}, torch_out, (tx,), mapped, dout)


def torch_mha() -> torch.nn.MultiheadAttention:
    torch.manual_seed(2)
    module = torch.nn.MultiheadAttention(C, H, dropout=0.0, bias=True, batch_first=True)
    with torch.no_grad():  # PyTorch initialises the biases to 0: make them count
        module.in_proj_bias.normal_()
        module.out_proj.bias.normal_()
    return module.double()


@pytest.mark.parametrize("layer", ["BidirectionalAttention", "CausalSelfAttention"])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_from_torch_multihead_attention(rng, layer, padded):
    reference = torch_mha()
    args = (C, H, CTX) if layer == "CausalSelfAttention" else (C, H)
    ours = getattr(na_fused, layer)(*args).astype(np.float64).eval()
    ours.load_state_dict(convert.fused_from_torch_mha(ta.to_numpy(reference)))
    x = rng.standard_normal((2, N, C))
    dout = rng.standard_normal((2, N, C))
    mask = padding_mask(rng, 2, N) if padded else None
    tx = to_torch(x, requires_grad=True)
    causal = layer == "CausalSelfAttention"

    torch_out, _ = reference(
        tx,
        tx,
        tx,
        key_padding_mask=None if mask is None else to_torch(mask),
        attn_mask=torch.ones(N, N, dtype=torch.bool).triu(1) if causal else None,
        need_weights=False,
    )
    torch_out.backward(to_torch(dout))

    mapped = convert.fused_from_torch_mha(torch_grads(reference))
    check_transfer(ours, (x,), {"mask": mask}, torch_out, (tx,), mapped, dout)


@pytest.mark.parametrize("padded", [False, True])
def test_cross_from_torch_multihead_attention(rng, padded):
    reference = torch_mha()
    ours = na_fused.CrossAttention(C, H).astype(np.float64).eval()
    ours.load_state_dict(convert.fused_from_torch_mha(ta.to_numpy(reference), cross=True))
    x, y = rng.standard_normal((2, N, C)), rng.standard_normal((2, M, C))
    dout = rng.standard_normal((2, N, C))
    mask = padding_mask(rng, 2, M) if padded else None
    tx, ty = to_torch(x, requires_grad=True), to_torch(y, requires_grad=True)

    torch_out, _ = reference(
        tx, ty, ty, key_padding_mask=None if mask is None else to_torch(mask), need_weights=False
    )
    torch_out.backward(to_torch(dout))

    mapped = convert.fused_from_torch_mha(torch_grads(reference), cross=True)
    check_transfer(ours, (x, y), {"mask": mask}, torch_out, (tx, ty), mapped, dout)


def test_torch_multihead_attention_from_fused_round_trip(rng):
    ours = na_fused.CausalSelfAttention(C, H, CTX, rng=rng).astype(np.float64).eval()
    reference = torch.nn.MultiheadAttention(C, H, batch_first=True).double()
    reference.load_state_dict(
        {k: to_torch(v) for k, v in convert.torch_mha_from_fused(ours.state_dict()).items()}
    )
    x = rng.standard_normal((2, N, C))

    torch_out, _ = reference(
        *(to_torch(x),) * 3,
        attn_mask=torch.ones(N, N, dtype=torch.bool).triu(1),
        need_weights=False,
    )

    assert_close(ours(x), torch_out, name="out")


@pytest.mark.parametrize(
    ("need_weights", "inference", "gives_nan"),
    [(True, False, True), (True, True, True), (False, True, True), (False, False, False)],
)
def test_torch_multihead_attention_on_fully_padded_rows(rng, need_weights, inference, gives_nan):
    """A finding about PyTorch (torch 2.13), recorded in docs/weight-transfer.md: for a query whose
    keys are all padding, nn.MultiheadAttention returns NaN with need_weights=True, and also with
    need_weights=False on its inference fast path (eval mode, no autograd); only the autograd
    path with need_weights=False gives finite rows (0 before the output bias), as our layers do."""
    reference = torch_mha().eval()
    x = to_torch(rng.standard_normal((2, N, C)), requires_grad=not inference)
    mask = to_torch(padding_mask(rng, 2, N))

    with torch.set_grad_enabled(not inference):
        out, _ = reference(x, x, x, key_padding_mask=mask, need_weights=need_weights)

    assert not torch.isnan(out[0]).any()
    assert bool(torch.isnan(out[-1]).all()) == gives_nan
    if not gives_nan:
        assert_close(out[-1], reference.out_proj.bias.expand(N, C), name="padded rows")


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gpt2_attention_layout(rng, implementation):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    config = transformers.GPT2Config(
        n_embd=C, n_head=H, n_positions=CTX, attn_pdrop=0.0, resid_pdrop=0.0
    )
    config._attn_implementation = implementation
    torch.manual_seed(3)
    reference = GPT2Attention(config).double().eval()
    ours = na_fused.CausalSelfAttention(C, H, CTX).astype(np.float64).eval()
    ours.load_state_dict(convert.fused_from_gpt2(ta.to_numpy(reference)))
    x = rng.standard_normal((2, N, C))
    dout = rng.standard_normal((2, N, C))
    tx = to_torch(x, requires_grad=True)
    # The GPT-2 model, not its attention module, builds the causal mask: eager attention used on
    # its own needs it passed in (as an additive mask); the SDPA path sets is_causal itself.
    causal = torch.full((N, N), float("-inf"), dtype=torch.float64).triu(1)[None, None]

    torch_out = reference(tx, attention_mask=causal if implementation == "eager" else None)[0]
    torch_out.backward(to_torch(dout))

    mapped = convert.fused_from_gpt2(torch_grads(reference))
    check_transfer(ours, (x,), {}, torch_out, (tx,), mapped, dout)
    round_trip = convert.gpt2_from_fused(ours.state_dict())
    for name, value in reference.state_dict().items():
        np.testing.assert_array_equal(round_trip[name], to_numpy(value))
