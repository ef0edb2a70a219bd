"""The correct decode kernels (checker.targets.decode): FlashMLA's signature reads V as the first
head_dim_v coordinates of its K pages; transformers' paged attention, behind flash-attn's
signature, equals the torch twin on out and on the pages it leaves (the adapter translates
layouts only), and refuses by name what it cannot take."""

from __future__ import annotations

import pytest
import torch

from parity_tests.checker.report.rows import KernelUnsupported
from parity_tests.checker.targets import decode as decode_kernels
from torch_attention.decode.paged import kvcache_attention

from ...conftest import assert_close


def _call(generator: torch.Generator, s_q: int = 2) -> dict:
    """A paged call of 2 sequences, shuffled pages of 4, GQA, float64."""
    pages, heads, kv_heads, d = 6, 4, 2, 8

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    return {
        "q": draw(2, s_q, heads, d), "k_cache": draw(pages, 4, kv_heads, d),
        "v_cache": draw(pages, 4, kv_heads, d), "k": draw(2, s_q, kv_heads, d),
        "v": draw(2, s_q, kv_heads, d), "block_table": torch.tensor([[4, 0, 2], [1, 5, 3]]),
        "cache_seqlens": torch.tensor([3, 7], dtype=torch.int32), "causal": True,
    }  # fmt: skip


@pytest.mark.parametrize("kernel", ["hf_paged_eager", "hf_paged_sdpa"])
def test_transformers_paged_attention_equals_the_twin_and_writes_the_pages(kernel):
    call = _call(torch.Generator().manual_seed(0))
    twin = {**call, "k_cache": call["k_cache"].clone(), "v_cache": call["v_cache"].clone()}
    expected = kvcache_attention(**twin).out

    out = getattr(decode_kernels, kernel)(**call)

    assert_close(out, expected, dtype="float32", name="out")  # eager's softmax is float32
    assert torch.equal(call["k_cache"], twin["k_cache"])
    assert torch.equal(call["v_cache"], twin["v_cache"])


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"causal": False}, "bidirectional queries"),
        ({"window_size": (3, 0)}, "window, softcap and ALiBi"),
        ({"return_softmax_lse": True}, "lse: transformers' attention functions return none"),
        ({"k": None, "v": None}, "new tokens other than the queries"),
    ],
)
def test_what_transformers_cannot_take_is_refused_by_name(changes, reason):
    call = {**_call(torch.Generator().manual_seed(1)), **changes}

    with pytest.raises(KernelUnsupported, match=reason):
        decode_kernels.hf_paged_sdpa(**call)


def test_flash_mla_reads_v_as_the_first_head_dim_v_coordinates_of_k():
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 2, 12, generator=generator, dtype=torch.float64)
    pages = torch.randn(3, 4, 1, 12, generator=generator, dtype=torch.float64)
    table, lengths = torch.tensor([[2, 0]]), torch.tensor([6], dtype=torch.int32)

    out, lse = decode_kernels.flash_mla_with_kvcache(q, pages, table, lengths, 8, None, None,
                                                     softmax_scale=0.3)  # fmt: skip

    keys = torch.cat([pages[2], pages[0]])[:6, 0]  # (6, 12), the sequence's tokens in order
    weights = torch.softmax(q[0, 0] @ keys.T * 0.3, dim=-1)  # (H, 6)
    assert_close(out[0, 0], weights @ keys[:, :8], name="out")
    assert lse.shape == (1, 2, 1)
