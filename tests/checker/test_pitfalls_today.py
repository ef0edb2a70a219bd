"""Today's options and real tiled kernels have pitfalls with teeth too: each kernel of
``checker.pitfalls_today`` (GQA, alignment, windows, softcap, ALiBi, lse, varlen, the ring's
block offset) and of ``checker.pitfalls_kernels`` (k read with v's strides, zero-padded keys in
the softmax, a block-edge bound off by one, an always-causal backward, NaN on the split-KV
path, ALiBi read at the kv head, dropout_p ignored) is flagged on the case and tensor
``PITFALLS`` names for it in bfloat16, the loosest dtype; in every dtype over 60 seeds of the
default battery by ``python -m parity_tests --calibrate 60`` (docs/pitfalls.md); and the named
cases of before miss each bug of a real kernel."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker import pitfalls_kernels, pitfalls_today
from parity_tests.checker.pitfalls import PITFALLS

from .test_pitfalls import assert_flagged_on_its_case_and_tensor


def _of(module) -> list[str]:
    return sorted(name for name, p in PITFALLS.items() if p.kernel.__module__ == module.__name__)


@pytest.mark.parametrize("name", _of(pitfalls_today))
def test_pitfall_is_flagged_on_its_case_and_tensor(name):
    assert_flagged_on_its_case_and_tensor(name)


@pytest.mark.parametrize("name", _of(pitfalls_kernels))
def test_a_real_kernels_bug_is_flagged_on_its_case_and_tensor(name):
    assert_flagged_on_its_case_and_tensor(name)


def test_the_bugs_of_real_kernels_hide_where_the_battery_did_not_look():
    # Each is right on the named cases of before: the plain, contiguous, short, many-headed
    # ones; only the cases built for block edges, layouts, split paths and pairs catch them.
    for name, case in (
        ("k_with_v_strides", "alibi-h"),
        ("padded_keys_in_softmax", "plain"),
        ("last_key_of_block_dropped", "causal-br-n<m"),
        ("always_causal_backward", "softcap"),
        ("nan_on_split_kv", "decode-n1"),
        ("alibi_by_kv_head", "alibi-bh-causal"),
    ):
        report = check_kernel(PITFALLS[name].kernel, spec="flash", dtypes=["float32"],
                              cases=[case])  # fmt: skip
        assert report.passed, (name, report.failures)
