"""The ring spec: a context-parallel kernel with ``ring_attention``'s signature judged on spawned
gloo ranks, the gathered sequence against the golden with the same policy as every spec, and
against a second call's, bit for bit."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker.pitfalls import PITFALLS
from parity_tests.checker.pitfalls.races import one_ulp_every_other_launch
from torch_attention.distributed import ring_attention

RING = "torch_attention.distributed:ring_attention"


def test_ring_attention_passes_on_two_ranks():
    report = check_kernel(
        RING, spec="ring", world_size=2, dtypes=["float32"],
        cases=["ring-causal-zigzag", "ring-gqa", "ring-window"],
    )  # fmt: skip

    assert report.passed, report.failures
    assert {row.tensor for row in report.rows} == {"out", "dq", "dk", "dv"}


def test_a_ring_with_a_wrong_block_offset_is_flagged():
    broken = PITFALLS["ring_wrong_block_offset"]

    report = check_kernel(broken.kernel, spec="ring", dtypes=["float32"], cases=[broken.case])

    failed = {row.tensor for row in report.failures}
    assert broken.tensor in failed and not report.passed


def raises(q, k, v, **options):
    import torch.distributed as dist

    raise RuntimeError(f"rank {dist.get_rank()} gave up")


def returns_the_query(q, k, v, **options):
    return q[..., :1]


@pytest.mark.parametrize(
    ("kernel", "detail"),
    [(raises, "RuntimeError: rank 0 gave up"), (returns_the_query, "expected (2, 2, 24, 16)")],
)
def test_a_kernel_that_fails_gets_an_error_verdict_and_the_run_goes_on(kernel, detail):
    report = check_kernel(kernel, spec="ring", dtypes=["float32"],
                          cases=["ring-plain", "ring-causal"])  # fmt: skip

    assert [row.verdict for row in report.rows] == ["error", "error"]
    assert all(detail in row.detail for row in report.rows)


def test_a_sequence_the_layout_cannot_split_is_refused_before_any_work():
    with pytest.raises(ValueError, match="does not split into 10 equal chunks"):
        check_kernel(RING, spec="ring", world_size=5, cases=["ring-causal-zigzag"])


def test_a_ring_kernel_that_does_not_pickle_is_refused():
    with pytest.raises(TypeError, match="spawned ranks by pickle"):
        check_kernel(lambda q, k, v, **o: q, spec="ring", dtypes=["float32"])


@pytest.mark.parametrize("world_size", [0, 1.5])
def test_world_size_must_be_a_positive_integer(world_size):
    with pytest.raises(ValueError, match="world_size must be an integer"):
        check_kernel(RING, spec="ring", world_size=world_size)


def racy_ring(q, k, v, **options):
    return one_ulp_every_other_launch(ring_attention(q, k, v, **options))


def test_a_ring_whose_output_changes_from_call_to_call_is_flagged():
    # claiming "deterministic", the backward runs twice too, on the ranks (its gradients agree)
    report = check_kernel(racy_ring, spec="ring", dtypes=["float32"], cases=["ring-causal"],
                          features={"causal", "deterministic"})  # fmt: skip

    assert [(row.tensor, row.verdict) for row in report.failures] == [("out", "nondeterministic")]
    assert {row.tensor for row in report.rows} == {"out", "dq", "dk", "dv"}
