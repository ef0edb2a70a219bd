"""Linear attention on the CPU, for ``python -m parity_tests.bench`` (part ``linear``; never a
timed test).

Issue 30: ``numpy_attention.linear_attention``'s chunked (WY/UT) form of the gated delta rule
runs in time linear in T and faster than its recurrent form, and a decode step of a
Qwen3-Next-shaped GatedDeltaNet layer costs the same whatever the context before it.

- **The core**, float32, B = 1, H = 16, K = V = 128 (Qwen3-Next's head widths), q and k
  L2-normalized, log-gates in [-0.5, -0.01], beta in [0, 1], 64-token chunks: forward+backward
  of each form at each T of ``SIZES``, the forward outside ``no_grad()`` and the backward of a
  random dout. The recurrent form runs at a T only while its time extrapolated from the previous
  T (times T / T_prev) stays within ``RECURRENT_BUDGET`` seconds.
- **The decode step**: ``numpy_attention.gated_deltanet.GatedDeltaNet`` shaped as Qwen3-Next-80B's
  linear-attention layers (``DECODE_SHAPE``), float32, batch 1, one new token after a prefill
  of each length of ``CONTEXTS`` through the layer itself into a ``LinearStateCache``; a step is
  timed on a copy of the cache so every repeat sees the same context.

Times are the best of ``repeats`` after one warm-up below ``ONCE_FROM`` tokens, one run from
there on. NumPy's BLAS runs with however many threads it has (the report's header says how many
cores); on a loaded machine set ``OPENBLAS_NUM_THREADS=1`` for both forms alike.

Tests: tests/bench/test_linear.py.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import numpy as np

from numpy_attention.grad_mode import no_grad
from numpy_attention.linear_attention import gated_delta_rule_backward, gated_delta_rule_forward

from .measure import best_time

SIZES = (2048, 4096, 8192)  # T
HEADS, WIDTH = 16, 128  # H, K = V
CHUNK = 64
RECURRENT_BUDGET = 120.0  # seconds: the recurrent run at T is skipped when expected longer
ONCE_FROM = 4096  # from this T on, each run is timed once, without a warm-up
LINEAR_TARGET = 1.5  # the chunk form's largest time per token / its smallest, over SIZES
# Qwen3-Next-80B-A3B's linear-attention layer: hidden 2048, 16 key heads and 32 value heads of
# width 128, a 4-tap convolution.
DECODE_SHAPE = {
    "hidden_size": 2048,
    "num_k_heads": 16,
    "num_v_heads": 32,
    "head_k_dim": 128,
    "head_v_dim": 128,
    "conv_kernel_size": 4,
}
CONTEXTS = (512, 2048, 8192)
DECODE_TARGET = 1.5  # the largest decode step / the smallest, over CONTEXTS


def _inputs(t: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """q, k (1, t, H, K) unit rows, v and dout (1, t, H, V), g and beta (1, t, H), float32."""
    shape = (1, t, HEADS, WIDTH)
    q, k = (rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v, dout = (rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
    g = -rng.uniform(0.01, 0.5, shape[:3]).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, shape[:3]).astype(np.float32)
    return q, k, v, g, beta, dout


def core_run(inputs: tuple[np.ndarray, ...], form: str) -> Callable[[], object]:
    """One forward+backward of the gated delta rule in ``form``; a run returns (out, grads)."""
    q, k, v, g, beta, dout = inputs

    def run() -> tuple:
        forward = gated_delta_rule_forward(q, k, v, g, beta, form=form, chunk_size=CHUNK)
        return forward.out, gated_delta_rule_backward(dout, forward.ctx)

    return run


def _time(run: Callable[[], object], t: int, repeats: int) -> float:
    if t >= ONCE_FROM:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    return best_time(run, repeats)


def core_rows(repeats: int) -> dict:
    """{"chunk": {T: seconds}, "recurrent": {T: seconds, or None where skipped}}."""
    rows: dict = {"chunk": {}, "recurrent": {}}
    previous: tuple[int, float] | None = None
    for t in SIZES:
        inputs = _inputs(t, np.random.default_rng(t))
        rows["chunk"][t] = _time(core_run(inputs, "chunk"), t, repeats)
        expected = None if previous is None else previous[1] * t / previous[0]
        if expected is not None and expected > RECURRENT_BUDGET:
            rows["recurrent"][t] = None
            continue
        rows["recurrent"][t] = _time(core_run(inputs, "recurrent"), t, repeats)
        previous = (t, rows["recurrent"][t])
    return rows


def decode_rows(repeats: int) -> dict:
    """{context: seconds of one decode step after that many tokens}."""
    from numpy_attention.gated_deltanet import GatedDeltaNet
    from numpy_attention.linear_cache import LinearStateCache

    shape = DECODE_SHAPE
    layer = GatedDeltaNet(**shape)
    conv_dim = 2 * shape["num_k_heads"] * shape["head_k_dim"]
    conv_dim += shape["num_v_heads"] * shape["head_v_dim"]
    rows = {}
    for context in CONTEXTS:
        rng = np.random.default_rng(context)
        cache = LinearStateCache(
            1, shape["num_v_heads"], shape["head_k_dim"], shape["head_v_dim"],
            conv_dim=conv_dim, conv_width=shape["conv_kernel_size"], dtype=np.float32,
        )  # fmt: skip
        prompt = rng.standard_normal((1, context, shape["hidden_size"]), dtype=np.float32)
        with no_grad():
            layer(prompt, cache=cache)
        token = rng.standard_normal((1, 1, shape["hidden_size"]), dtype=np.float32)

        def step(cache: LinearStateCache = cache, token: np.ndarray = token) -> object:
            with no_grad():
                return layer(token, cache=copy.deepcopy(cache))

        rows[context] = best_time(step, repeats)
    return rows


def linear_rows(repeats: int) -> dict:
    """The core's rows and the decode steps'."""
    return {**core_rows(repeats), "decode": decode_rows(repeats)}


def _per_token(rows: dict) -> dict:
    return {t: s / t for t, s in rows["chunk"].items()}


def linear_lines(rows: dict, seconds: Callable[[float], str]) -> list[str]:
    per_token = _per_token(rows)
    lines = [
        "### Linear attention (the gated delta rule) on the CPU, float32",
        "",
        f"B = 1, H = {HEADS}, K = V = {WIDTH}, {CHUNK}-token chunks; forward+backward of the "
        "chunked (WY/UT) form and of the recurrent form (one token at a time).",
        "",
        "| T | chunk | per token | recurrent | recurrent / chunk |",
        "|---|---|---|---|---|",
    ]
    for t, chunk in rows["chunk"].items():
        recurrent = rows["recurrent"].get(t)
        text = "not run" if recurrent is None else seconds(recurrent)
        ratio = "-" if recurrent is None else f"{recurrent / chunk:.2f}x"
        lines.append(f"| {t} | {seconds(chunk)} | {per_token[t] * 1e6:.1f} us | {text} | {ratio} |")
    skipped = [t for t, s in rows["recurrent"].items() if s is None]
    if skipped:
        lines += [
            "",
            f"Recurrent not run at T = {', '.join(map(str, skipped))}: expected over "
            f"{RECURRENT_BUDGET:.0f} s from the previous size times T / T_prev.",
        ]
    decode = rows.get("decode")
    if decode:
        shape = DECODE_SHAPE
        lines += [
            "",
            f"Decode step of a Qwen3-Next-shaped GatedDeltaNet layer (hidden "
            f"{shape['hidden_size']}, {shape['num_k_heads']} key and {shape['num_v_heads']} "
            f"value heads of {shape['head_k_dim']}), one token after a prefill of the context:",
            "",
            "| context | decode step |",
            "|---|---|",
            *[f"| {context} | {seconds(s)} |" for context, s in decode.items()],
        ]
    return [*lines, ""]


def targets(rows: dict | None) -> list[str]:
    if not rows or not rows.get("chunk"):
        return []
    per_token = _per_token(rows)
    spread = max(per_token.values()) / min(per_token.values())
    lines = [
        f"| NumPy gated delta rule, chunk form fwd+bwd time per token flat over T = "
        f"{', '.join(map(str, per_token))} (largest / smallest <= {LINEAR_TARGET}x) | "
        f"{spread:.2f}x | {'yes' if spread <= LINEAR_TARGET else 'no'} |"
    ]
    both = [t for t, s in rows["recurrent"].items() if s is not None]
    if both:
        slowest = min(rows["recurrent"][t] / rows["chunk"][t] for t in both)
        lines.append(
            f"| NumPy gated delta rule, chunk form faster than recurrent at T = "
            f"{', '.join(map(str, both))} (smallest recurrent / chunk > 1x) | {slowest:.2f}x | "
            f"{'yes' if slowest > 1 else 'no'} |"
        )
    decode = rows.get("decode")
    if decode:
        flat = max(decode.values()) / min(decode.values())
        lines.append(
            f"| GatedDeltaNet decode step flat over contexts {', '.join(map(str, decode))} "
            f"(largest / smallest <= {DECODE_TARGET}x) | {flat:.2f}x | "
            f"{'yes' if flat <= DECODE_TARGET else 'no'} |"
        )
    return lines
