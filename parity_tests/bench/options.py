"""The cost of today's options on the tiled path, for ``python -m parity_tests.bench`` (parts
``options`` and ``window``; never a timed test).

``options``: causal float32 attention at (1, 12, 2048, 64), forward (inference) and
forward+backward, plain and with each option (GQA with 4 kv heads, softcap, ALiBi, sinks, a
window), each against plain in the same run. The work a call does is the number of visible
scores it computes, so a window, which sees fewer keys than plain causal, is compared per visible
score: ``(time / visible scores) / (plain time / plain visible scores)``. Every other option sees
exactly what plain causal sees. ``window``: a window of 512 keys at (1, 4, 16384, 64) against the
full causal run, forward+backward, the ratio the issue's target names.

Tests: tests/bench/test_options.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from numpy_attention import functional, no_grad

OPTIONS_SHAPE = (1, 12, 2048, 64)  # (B, H, N, D)
WINDOW_SHAPE = (1, 4, 16384, 64)
WINDOW = 512  # keys, the query included: window=(511, 0) with causal
OPTION_TARGET = 1.15  # the bound on each option, per visible score
WINDOW_TARGET = 0.15  # the bound on the window of 512 against full causal at N = 16384


def option_kwargs(h: int) -> dict[str, dict[str, Any]]:
    """The options compared, each with causal=True, for H = h query heads."""
    rng = np.random.default_rng(0)
    return {
        "plain": {},
        "GQA (4 kv heads)": {"enable_gqa": True},
        "softcap 30": {"softcap": 30.0},
        "ALiBi": {"alibi_slopes": (2.0 ** -np.arange(1, h + 1)).astype(np.float32)},
        "sinks": {"sinks": rng.standard_normal(h).astype(np.float32)},
        "window 1024": {"window": (1023, 0)},
    }


def visible_scores(n: int, window: tuple[int, int] | None) -> int:
    """Scores a causal (N, N) call sees per head: N(N+1)/2, or fewer with a window."""
    if window is None:
        return n * (n + 1) // 2
    keys = window[0] + 1
    return sum(min(i + 1, keys) for i in range(n))


def _inputs(shape: tuple[int, int, int, int], kv_heads: int) -> tuple[np.ndarray, ...]:
    b, h, n, d = shape
    rng = np.random.default_rng(1)
    q = rng.standard_normal((b, h, n, d), dtype=np.float32)
    k, v = (rng.standard_normal((b, kv_heads, n, d), dtype=np.float32) for _ in range(2))
    dout = rng.standard_normal((b, h, n, d), dtype=np.float32)
    return q, k, v, dout


def _runs(q, k, v, dout, **kwargs: Any) -> tuple[Callable[[], object], Callable[[], object]]:
    def forward() -> None:
        with no_grad():
            functional.attention_forward(q, k, v, causal=True, impl="tiled", **kwargs)

    def forward_backward() -> None:
        result = functional.attention_forward(q, k, v, causal=True, impl="tiled", **kwargs)
        functional.attention_backward(dout, result.ctx)

    return forward, forward_backward


def option_rows(best_time: Callable[[Callable[[], object], int], float], repeats: int) -> dict:
    """{option: {"fwd": s, "fwd+bwd": s, "visible": scores}} at OPTIONS_SHAPE.

    Plain and each option alternate, round after round, and each keeps its best time: load on
    a shared machine then hits them alike.
    """
    b, h, n, d = OPTIONS_SHAPE
    inputs = {kv: _inputs(OPTIONS_SHAPE, kv) for kv in (h, 4)}
    runs = {}
    for name, kwargs in option_kwargs(h).items():
        kv = 4 if kwargs.get("enable_gqa") else h
        runs[name] = _runs(*inputs[kv], **kwargs)
    rows = {
        name: {"fwd": np.inf, "fwd+bwd": np.inf, "visible": visible_scores(n, kw.get("window"))}
        for name, kw in option_kwargs(h).items()
    }
    for _ in range(repeats):
        for name, (forward, forward_backward) in runs.items():
            rows[name]["fwd"] = min(rows[name]["fwd"], best_time(forward, 1))
            rows[name]["fwd+bwd"] = min(rows[name]["fwd+bwd"], best_time(forward_backward, 1))
    return rows


def window_rows(best_time: Callable[[Callable[[], object], int], float]) -> dict:
    """Forward+backward at WINDOW_SHAPE: full causal and a causal window of WINDOW keys."""
    q, k, v, dout = _inputs(WINDOW_SHAPE, WINDOW_SHAPE[1])
    n = WINDOW_SHAPE[2]
    full = _runs(q, k, v, dout)[1]
    windowed = _runs(q, k, v, dout, window=(WINDOW - 1, 0))[1]
    return {
        "full causal": {"fwd+bwd": best_time(full, 1), "visible": visible_scores(n, None)},
        f"window {WINDOW}": {
            "fwd+bwd": best_time(windowed, 1),
            "visible": visible_scores(n, (WINDOW - 1, 0)),
        },
    }


def per_visible(rows: dict, name: str, kind: str) -> float:
    """``name``'s time per visible score over plain's (the first row's)."""
    base = next(iter(rows))
    return (rows[name][kind] / rows[name]["visible"]) / (rows[base][kind] / rows[base]["visible"])


def option_lines(rows: dict, seconds: Callable[[float], str]) -> list[str]:
    lines = [
        f"### Today's options on the tiled path, causal float32 at {OPTIONS_SHAPE}",
        "",
        "Each option against plain causal in the same run, per visible score (the window sees "
        "fewer keys; every other option sees what plain sees).",
        "",
        "| option | forward | fwd / plain | forward+backward | fwd+bwd / plain |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {seconds(row['fwd'])} | {per_visible(rows, name, 'fwd'):.2f}x | "
            f"{seconds(row['fwd+bwd'])} | {per_visible(rows, name, 'fwd+bwd'):.2f}x |"
        )
    return [*lines, ""]


def window_lines(rows: dict, seconds: Callable[[float], str]) -> list[str]:
    full, windowed = rows.values()
    ratio = windowed["fwd+bwd"] / full["fwd+bwd"]
    work = windowed["visible"] / full["visible"]
    return [
        f"### A window of {WINDOW} keys at {WINDOW_SHAPE}, causal float32, forward+backward",
        "",
        f"- full causal: {seconds(full['fwd+bwd'])}; window {WINDOW}: "
        f"{seconds(windowed['fwd+bwd'])}; ratio {ratio:.3f} (its visible scores are "
        f"{work:.3f} of full causal's)",
        "",
    ]


def targets(options: dict | None, window: dict | None) -> list[str]:
    """Rows of the targets table for the options and the window."""
    rows = []
    if options:
        for name in list(options)[1:]:
            worst = max(per_visible(options, name, kind) for kind in ("fwd", "fwd+bwd"))
            met = "yes" if worst <= OPTION_TARGET else "no"
            rows.append(
                f"| tiled {name} <= {OPTION_TARGET}x plain per visible score at "
                f"{OPTIONS_SHAPE} (worse of fwd, fwd+bwd) | {worst:.2f}x | {met} |"
            )
    if window:
        full, windowed = window.values()
        ratio = windowed["fwd+bwd"] / full["fwd+bwd"]
        met = "yes" if ratio <= WINDOW_TARGET else "no"
        rows.append(
            f"| window {WINDOW} fwd+bwd <= {WINDOW_TARGET}x full causal at {WINDOW_SHAPE} | "
            f"{ratio:.3f}x | {met} |"
        )
    return rows
