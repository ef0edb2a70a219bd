"""The serving APIs' pure-Python checker (numpy_attention.decode.serving_arguments) on Python
lists, as both twins hand it their arrays: FlashInfer's CSR table read into pages and lengths,
its int32 rule, and each refusal naming the array and the sequence. The twins' own refusals
through it: tests/numpy_attention/decode/test_serving.py and the torch twin's."""

from __future__ import annotations

import pytest

from numpy_attention.decode.arguments import Integers
from numpy_attention.decode.serving_arguments import check_int32, check_kv_layout, csr_pages


def _ints(values: list[int], dtype: str = "int32") -> Integers:
    return Integers(dtype, True, (len(values),), values)


def test_csr_pages_reads_each_sequence_s_pages_and_length():
    pages, lengths = csr_pages(_ints([0, 2, 2, 5]), _ints([7, 3, 1, 4, 6, 9]),
                               _ints([5, 0, 1]), 16, 10)  # fmt: skip

    assert pages == [[7, 3], [], [1, 4, 6]]  # the spare entry 9 past indptr[-1] is not read
    assert lengths == [16 + 5, 0, 2 * 16 + 1]


@pytest.mark.parametrize(
    ("indptr", "last", "match"),
    [
        ([0, 2, 1], [1, 1], "paged_kv_indptr"),  # decreasing
        ([1, 2], [1], "paged_kv_indptr"),  # not from 0
        ([0, 2], [0], r"sequence 0: paged_kv_last_page_len 0 is outside \[1, page_size = 16\]"),
        ([0, 2], [17], "outside"),
        ([0, 0], [3], "sequence 0: no pages but paged_kv_last_page_len 3"),
    ],
)
def test_csr_pages_refuses_a_bad_table_naming_it(indptr, last, match):
    with pytest.raises(ValueError, match=match):
        csr_pages(_ints(indptr), _ints([7, 3]), _ints(last), 16, 10)


def test_a_page_outside_the_pool_is_named_with_its_place():
    with pytest.raises(ValueError, match=r"paged_kv_indices\[1\] = 10 is not one of the 10"):
        csr_pages(_ints([0, 2]), _ints([7, 10]), _ints([1]), 16, 10)


def test_int64_metadata_is_refused_as_flashinfer_reads_it_wrong():
    check_int32("qo_indptr", _ints([0, 1]))
    check_int32("qo_indptr", _ints([0, 1], "torch.int32"))
    with pytest.raises(TypeError, match="qo_indptr must be int32.*silently returns zeros"):
        check_int32("qo_indptr", _ints([0, 1], "int64"))
    with pytest.raises(TypeError, match="paged_kv_indices must be int32"):
        csr_pages(_ints([0, 1]), _ints([3], "int64"), _ints([1]), 16, 10)


def test_kv_layout_is_nhd_or_hnd():
    assert check_kv_layout("NHD") is not check_kv_layout("HND")
    with pytest.raises(ValueError, match="kv_layout"):
        check_kv_layout("NDH")
