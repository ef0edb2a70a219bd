"""Dropout through both kinds of signature: through SDPA's the keep-mask is read back with the
real call's shapes, mask, causal rule, GQA and memory layout; through flash-attn's, which
returns no mask, draws are judged statistically: a correct kernel passes, one that ignores
dropout_p, forgets to rescale or drops too much is flagged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.battery.attention.case import Case
from parity_tests.checker.golden.attention_baseline import dropout_variance
from parity_tests.checker.judge.policy import judge_draws
from parity_tests.checker.pitfalls.tiled import ignores_dropout
from parity_tests.checker.targets import adapters

READBACK = [
    Case("drop-causal-gqa", 1, 4, 9, 21, 8, dv=4, heads_kv=2, causal=True, dropout_p=0.3),
    Case("drop-float-fused", 2, 2, 11, 11, 8, mask="float", dropout_p=0.3, memory="fused"),
    Case("drop-dead-bool", 1, 2, 7, 13, 8, mask="dead-bool", dropout_p=0.3, memory="offset"),
]


@pytest.mark.parametrize("case", READBACK, ids=lambda case: case.name)
def test_sdpas_keep_mask_is_read_back_whatever_the_calls_options(case):
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=[case])

    assert report.passed, report.failures
    (keep,) = [row for row in report.rows if row.tensor == "keep"]
    assert keep.verdict == "pass" and keep.golden_max == pytest.approx(0.7)


FLASH_DROPOUT = Case("flash-drop", 2, 2, 33, 47, 16, causal=True, align="bottom-right",
                     dropout_p=0.3, memory="kv-strides")  # fmt: skip


def _not_rescaled(q, k, v, dropout_p=0.0, **kwargs):
    """Dropout applied, its 1 / (1 - p) forgotten: the mean of the draws shrinks."""
    result = adapters.flash_attn_func(q, k, v, dropout_p=dropout_p, **kwargs)
    if isinstance(result, tuple):
        return (result[0] * (1 - dropout_p), *result[1:])
    return result * (1 - dropout_p)


def _drops_twice_as_much(q, k, v, dropout_p=0.0, **kwargs):
    """p read as min(2p, 0.9), rescaled for it: right on average, too spread."""
    return adapters.flash_attn_func(q, k, v, dropout_p=min(2 * dropout_p, 0.9), **kwargs)


def test_a_correct_flash_kernel_passes_the_draws():
    report = check_kernel(adapters.flash_attn_func, spec="flash", dtypes=["float32"],
                          cases=[FLASH_DROPOUT])  # fmt: skip

    assert report.passed, report.failures
    assert {row.tensor for row in report.rows} == {"out", "dq", "dk", "dv", "lse", "keep"}


@pytest.mark.parametrize(
    ("kernel", "detail"),
    [
        (ignores_dropout, "move the output 0 times"),
        (_not_rescaled, "the mean of"),
        (_drops_twice_as_much, "move the output"),
    ],
    ids=["ignored", "not-rescaled", "too-much"],
)
def test_a_flash_kernel_whose_dropout_is_wrong_is_flagged_by_its_draws(kernel, detail):
    report = check_kernel(kernel, spec="flash", dtypes=["float32"], cases=[FLASH_DROPOUT])

    (row,) = [row for row in report.rows if row.tensor == "keep"]
    assert row.verdict == "fail" and detail in row.detail
    assert not report.passed


def _draws(p: float, count: int, rng: np.random.Generator, *, ignore: bool = False):
    """``count`` outputs of inverted dropout on random weights (8 rows of 20 keys, Dv 3)."""
    probs = rng.dirichlet(np.ones(20), size=8)  # (8, 20), rows summing to 1
    v = rng.standard_normal((20, 3))
    keep = rng.random((count, 8, 20)) >= (0.0 if ignore else p)
    draws = (probs * keep / (1.0 if ignore else 1.0 - p)) @ v  # (count, 8, 3)
    spread = p / (1 - p) * (probs**2) @ (v**2)
    return draws, probs @ v, spread


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_draws_of_correct_dropout_pass_over_seeds(p):
    rows = [judge_draws("c", "float32", p, *_draws(p, 16, np.random.default_rng(seed)))
            for seed in range(20)]  # fmt: skip

    assert all(row.verdict == "pass" for row in rows), max(row.ratio for row in rows)


def test_draws_equal_to_the_p0_output_fail_and_nan_is_nonfinite():
    draws, center, spread = _draws(0.3, 16, np.random.default_rng(0), ignore=True)

    assert judge_draws("c", "float32", 0.3, draws, center, spread).verdict == "fail"
    draws[3, 0, 0] = math.nan
    assert judge_draws("c", "float32", 0.3, draws, center, spread).verdict == "nonfinite"


def test_the_dropout_variance_is_what_the_draws_give():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=generator, dtype=torch.float64)
               for _ in range(3))  # fmt: skip
    p, count = 0.3, 20000
    probs = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)  # (1, 2, 3, 3)
    keep = torch.rand((count, 1, 2, 3, 3), generator=generator, dtype=torch.float64) >= p
    draws = (probs * keep / (1 - p)) @ v  # (count, 1, 2, 3, 4)

    expected = dropout_variance(q, k, v, p)

    assert torch.allclose(draws.var(dim=0), expected, rtol=0.1, atol=1e-3)
