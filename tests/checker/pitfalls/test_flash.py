"""The bugs of real tiled kernels (``pitfalls.tiled``, through flash-attn's signature) hide
where a hand-picked battery did not look: each is right on the named cases of before (the
plain, contiguous, short, many-headed ones), and only the cases built for block edges,
layouts, split paths and pairs catch them (tests/checker/pitfalls/test_init.py)."""

from __future__ import annotations

from parity_tests import check_kernel
from parity_tests.checker.pitfalls import all_pitfalls

PITFALLS = all_pitfalls()


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
