"""parity_tests/bench/options.py without timing anything: the visible scores each run is divided
by, the options it names, and the ratios and yes/no of the report on hand-made rows.

The rows are made of dyadic numbers (1.0, 2.0, 64 visible scores, ...) so that every ratio is
exact and a target exactly met is met, not lost to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import functional, no_grad
from parity_tests.bench import options as bench_options
from parity_tests.bench.options import (
    OPTIONS_SHAPE,
    WINDOW,
    WINDOW_SHAPE,
    option_kwargs,
    option_lines,
    per_visible,
    targets,
    visible_scores,
    window_lines,
)
from parity_tests.tolerances import FLOAT32_RTOL, rel_error

WINDOWS = [None, (0, 0), (3, 0), (6, 0), (200, 0)]  # (6, 0) is all of causal at N = 7


def _band(n: int, window: tuple[int, int] | None) -> int:
    """Cells (i, j) of an (N, N) grid with j <= i (causal) and i - j <= left (the window)."""
    i = np.arange(n)[:, None]  # (N, 1)
    j = np.arange(n)[None, :]  # (1, N)
    seen = j <= i
    if window is not None:
        seen &= i - j <= window[0]
    return int(np.count_nonzero(seen))


def _seconds(t: float) -> str:
    return f"{t:g} s"


@pytest.mark.parametrize("n", [1, 7, 113])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_visible_scores_counts_the_causal_band(n, window):
    assert visible_scores(n, window) == _band(n, window)


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_visible_scores_are_the_probabilities_the_tiled_path_computes(window):
    # Equal scores and v = I: out is the probability matrix itself, positive where a key is seen.
    n = 13
    q = k = np.zeros((1, 1, n, 4))  # (B, H, N, D)
    v = np.eye(n)[None, None]  # (1, 1, N, N)
    kwargs = {} if window is None else {"window": window}

    with no_grad():
        probs = functional.attention_forward(q, k, v, causal=True, impl="tiled", **kwargs).out

    assert np.count_nonzero(probs) == visible_scores(n, window)


def test_option_kwargs_name_plain_first_then_each_option():
    kwargs = option_kwargs(5)

    assert list(kwargs) == [
        "plain",
        "GQA (4 kv heads)",
        "softcap 30",
        "ALiBi",
        "sinks",
        "window 1024",
    ]
    assert kwargs["plain"] == {}  # per_visible divides by the first row
    assert kwargs["GQA (4 kv heads)"] == {"enable_gqa": True}
    assert kwargs["softcap 30"] == {"softcap": 30.0}
    assert kwargs["window 1024"] == {"window": (1023, 0)}
    window = kwargs["window 1024"]["window"]
    assert visible_scores(2000, window) - visible_scores(1999, window) == 1024  # a late row's keys
    for name in ("ALiBi", "sinks"):
        (per_head,) = kwargs[name].values()
        assert per_head.shape == (5,) and per_head.dtype == np.float32, name


@pytest.mark.parametrize("name", ["softcap 30", "ALiBi", "sinks", "window 1024"])
def test_each_score_option_changes_plain_on_the_tiled_path(name, rng):
    # N past the window of 1024 keys, so that the window hides some.
    h, n, d = 3, 1030, 8
    q, k, v = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))

    with no_grad():
        plain = functional.attention_forward(q, k, v, causal=True, impl="tiled").out
        out = functional.attention_forward(
            q, k, v, causal=True, impl="tiled", **option_kwargs(h)[name]
        ).out

    assert rel_error(out, plain) > FLOAT32_RTOL


def _option_rows() -> dict:
    return {
        "plain": {"fwd": 2.0, "fwd+bwd": 8.0, "visible": 64},
        "softcap 30": {"fwd": 3.0, "fwd+bwd": 8.0, "visible": 64},
        "window 1024": {"fwd": 1.0, "fwd+bwd": 2.0, "visible": 16},
    }


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("plain", "fwd", 1.0),
        ("softcap 30", "fwd", 1.5),
        ("softcap 30", "fwd+bwd", 1.0),
        ("window 1024", "fwd", 2.0),  # half plain's time for a quarter of its scores
        ("window 1024", "fwd+bwd", 1.0),
    ],
)
def test_per_visible_is_time_per_score_over_the_first_rows(name, kind, expected):
    assert per_visible(_option_rows(), name, kind) == expected


def test_per_visible_divides_by_the_first_row_whatever_its_name():
    rows = {"base": {"fwd": 4.0, "visible": 8}, "plain": {"fwd": 1.0, "visible": 8}}

    assert per_visible(rows, "plain", "fwd") == 0.25


def test_option_lines_print_each_row_and_its_ratios():
    lines = option_lines(_option_rows(), _seconds)

    assert lines[0] == f"### Today's options on the tiled path, causal float32 at {OPTIONS_SHAPE}"
    assert lines[-5:] == [
        "|---|---|---|---|---|",
        "| plain | 2 s | 1.00x | 8 s | 1.00x |",
        "| softcap 30 | 3 s | 1.50x | 8 s | 1.00x |",
        "| window 1024 | 1 s | 2.00x | 2 s | 1.00x |",
        "",
    ]


def _window_rows(windowed: float) -> dict:
    return {
        "full causal": {"fwd+bwd": 8.0, "visible": 64},
        f"window {WINDOW}": {"fwd+bwd": windowed, "visible": 16},
    }


def test_window_lines_print_the_time_ratio_and_the_work_ratio():
    lines = window_lines(_window_rows(1.0), _seconds)

    assert lines[0].startswith(f"### A window of {WINDOW} keys at {WINDOW_SHAPE}")
    assert lines[2] == (
        f"- full causal: 8 s; window {WINDOW}: 1 s; ratio 0.125 (its visible scores are 0.250 "
        "of full causal's)"
    )


def test_targets_of_nothing_measured_are_none():
    assert targets(None, None) == []


@pytest.mark.parametrize(
    ("fwd", "fwd_bwd", "shown", "met"),
    [
        (1.15, 1.0, "1.15x", "yes"),  # exactly the bound
        (1.0, 1.15, "1.15x", "yes"),
        (1.16, 1.0, "1.16x", "no"),
        (1.0, 1.16, "1.16x", "no"),  # the worse of the two is judged
    ],
)
def test_an_option_target_is_met_at_the_bound_by_its_worse_run(fwd, fwd_bwd, shown, met):
    rows = {
        "plain": {"fwd": 1.0, "fwd+bwd": 1.0, "visible": 64},
        "sinks": {"fwd": fwd, "fwd+bwd": fwd_bwd, "visible": 64},
    }

    lines = targets(rows, None)

    assert lines == [
        f"| tiled sinks <= {bench_options.OPTION_TARGET}x plain per visible score at "
        f"{OPTIONS_SHAPE} (worse of fwd, fwd+bwd) | {shown} | {met} |"
    ]


@pytest.mark.parametrize(
    ("windowed", "shown", "met"),
    [(1.2, "0.150x", "yes"), (1.25, "0.156x", "no")],  # 1.2 / 8 is the bound exactly
)
def test_the_window_target_is_met_at_the_bound(windowed, shown, met):
    lines = targets(None, _window_rows(windowed))

    assert lines == [
        f"| window {WINDOW} fwd+bwd <= {bench_options.WINDOW_TARGET}x full causal at "
        f"{WINDOW_SHAPE} | {shown} | {met} |"
    ]
