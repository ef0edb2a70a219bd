"""Memory layouts: each keeps the values and shapes and lays them out as it says (views of one
fused buffer, k and v with different strides, a storage offset), in both kinds of spec layout;
a kernel gets them as they are, and one that writes through a view is still caught."""

from __future__ import annotations

import pytest
import torch

from parity_tests import check_kernel
from parity_tests.checker.running import memory
from parity_tests.checker.targets import adapters


def _qkv(heads_first: bool, n: int = 5, m: int = 7):
    """q (heads before length when ``heads_first``), k, v with H = 4, H_kv = 2, D = 8, Dv = 6."""
    shapes = ((2, 4, n, 8), (2, 2, m, 8), (2, 2, m, 6))
    tensors = [torch.randn(shape) for shape in shapes]
    return [t if heads_first else t.transpose(1, 2) for t in tensors]


@pytest.mark.parametrize("heads_first", [True, False])
@pytest.mark.parametrize("kind", ["contiguous", "fused", "kv-strides", "offset"])
def test_a_layout_keeps_values_shapes_and_a_unit_last_stride(kind, heads_first):
    given = _qkv(heads_first)

    placed = memory.place(kind, *given, heads_first)

    for before, after in zip(given, placed, strict=True):
        assert torch.equal(after, before) and after.stride(-1) == 1
        assert after.is_leaf and not after.requires_grad


@pytest.mark.parametrize("heads_first", [True, False])
def test_fused_q_k_v_are_views_of_one_token_major_buffer(heads_first):
    q, k, v = memory.place("fused", *_qkv(heads_first, n=7), heads_first)

    storage = q.untyped_storage().data_ptr()
    assert k.untyped_storage().data_ptr() == storage == v.untyped_storage().data_ptr()
    token = 1 if heads_first else 0  # the length axis among the last three
    assert q.stride(-3 + token) == 4 * 8 + 2 * 8 + 2 * 6  # one token's row of the buffer


def test_with_another_length_fused_k_and_v_share_a_buffer_and_q_has_its_own():
    q, k, v = memory.place("fused", *_qkv(True, n=5, m=7), True)

    assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()


@pytest.mark.parametrize("heads_first", [True, False])
def test_kv_strides_gives_k_and_v_different_strides(heads_first):
    q, k, _ = _qkv(heads_first)
    v = torch.randn_like(k)  # even with Dv = D, where contiguous k and v have equal strides

    _, placed_k, placed_v = memory.place("kv-strides", q, k, v, heads_first)

    assert placed_k.stride() != placed_v.stride()


def test_offset_starts_past_nan():
    q, k, v = memory.place("offset", *_qkv(True), True)

    assert q.storage_offset() == memory.OFFSET and q.is_contiguous()
    head = torch.as_strided(q, (memory.OFFSET,), (1,), 0)
    assert torch.isnan(head).all()


def _strides_seen(q, k, v, **kwargs):
    """flash-attn's signature: right, and records what it was given."""
    _strides_seen.seen.append((q.is_contiguous(), k.stride(), v.stride(), q.storage_offset()))
    return adapters.flash_attn_func(q, k, v, **kwargs)


_strides_seen.seen = []


def test_the_kernel_gets_the_layout_the_case_says():
    from parity_tests.checker.battery.attention.case import Case

    cases = [Case(f"layout-{kind}", 1, 2, 9, 9, 8, memory=kind)
             for kind in ("contiguous", "fused", "kv-strides", "offset")]  # fmt: skip
    _strides_seen.seen.clear()

    report = check_kernel(_strides_seen, spec="flash", dtypes=["float32"], cases=cases)

    assert report.passed, report.failures
    first, second = _strides_seen.seen[::2], _strides_seen.seen[1::2]  # each case called twice
    assert second == first
    contiguous, fused, kv_strides, offset = first
    assert contiguous[0] and not fused[0] and offset[3] == memory.OFFSET
    assert kv_strides[1] != kv_strides[2] and contiguous[1] == contiguous[2]


def _writes_into_q(q, k, v, **kwargs):
    result = adapters.flash_attn_func(q, k, v, **kwargs)
    q.data[0, 0, 0, 0] += 1.0  # through the view, into the fused buffer
    return result


def test_a_kernel_writing_through_a_view_of_the_fused_buffer_is_caught():
    from parity_tests.checker.battery.attention.case import Case

    case = Case("fused-write", 1, 2, 9, 9, 8, memory="fused")

    report = check_kernel(_writes_into_q, spec="flash", dtypes=["float32"], cases=[case])

    (row,) = [row for row in report.rows if row.verdict == "inplace"]
    assert row.tensor == "q" and row.error == pytest.approx(1.0, abs=1e-6)
