"""The query temperature: the queries, after RoPE, multiplied by a factor that depends on the
token's position p alone, so that attention sharpens as the context grows. Two kinds, each with
its parameters (``query_temperature={"kind": ..., ...}`` on ``GroupedQueryAttention``):

    log_floor:  t(p) = 1 + beta * log(1 + floor((p + offset) / length))
                Ministral 3 (beta = llama_4_scaling_beta, length = its
                original_max_position_embeddings, offset 0); Llama 4's NoPE layers (beta =
                attn_scale, length = floor_scale, offset 1)
    power:      t(p) = (1 + (p + offset) / length) ** exponent
                Beam's NoPE layers (exponent 0.1, length 2048, offset 1), computed as
                exp(exponent * log1p((p + offset) / length)) as the model computes it

    q'[..., p, :] = t(p) * q[..., p, :]

p is the query's RoPE position by default. ``"positions": "cache"`` in the spec counts it on the
cache instead, ``cache.length + i`` for token i of the call, whatever the RoPE positions are:
Llama 4 does (``past_key_values.get_seq_length() + arange(N)``), so a left-padded sequence's
temperature counts its padding, where its RoPE positions do not.

``MultiHeadLatentAttention``'s ``query_temperature=(beta, length)`` (Mistral 4) is the
log_floor kind with offset 0, computed there by its own ``query_temperature_table``.

t is a constant per query row: the backward scales the gradient by the same factor,
dq = t(p) * dq'. Keys are not scaled, so the cache holds the same keys as without it.

Precision: t is computed in float64 from the positions, then cast to q's dtype (the positions
are integers; a float32 log would put ~1e-8 into a float64 comparison).

Shape legend: B batch, H heads, N tokens, D head width.

Derivation: docs/derivations/query-temperature.md.
Tests: tests/numpy_attention/test_temperature.py; in the layer,
tests/numpy_attention/test_grouped.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from . import validation

__all__ = [
    "TEMPERATURE_KINDS",
    "TEMPERATURE_POSITIONS",
    "TemperatureCtx",
    "check_temperature",
    "query_temperature_backward",
    "query_temperature_forward",
    "temperature_scale",
]

TEMPERATURE_KINDS: dict[str, tuple[str, ...]] = {
    "log_floor": ("beta", "length", "offset"),
    "power": ("exponent", "length", "offset"),
}
# What p counts (the spec's optional "positions"): the RoPE positions, or the cache's
TEMPERATURE_POSITIONS = ("rope", "cache")


def check_temperature(spec: Any) -> dict[str, Any] | None:
    """The temperature's spec checked: None, or a mapping with ``kind`` (a key of
    ``TEMPERATURE_KINDS``) and exactly that kind's parameters, ``length`` > 0 and every
    parameter finite, and optionally ``positions`` (one of ``TEMPERATURE_POSITIONS``). Returns
    a plain dict of floats (``kind`` a str, and ``positions`` kept only when ``"cache"``)."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise TypeError(
            f"query_temperature must be None or a mapping with a 'kind', got {type(spec).__name__}"
        )
    kind = spec.get("kind")
    if kind not in TEMPERATURE_KINDS:
        raise ValueError(
            f"query_temperature['kind'] must be one of {list(TEMPERATURE_KINDS)}, got {kind!r}"
        )
    names = TEMPERATURE_KINDS[kind]
    counted = spec.get("positions", "rope")
    if counted not in TEMPERATURE_POSITIONS:
        raise ValueError(
            f"query_temperature['positions'] must be one of {list(TEMPERATURE_POSITIONS)}, got "
            f"{counted!r}"
        )
    given = set(spec) - {"kind", "positions"}
    if given != set(names):
        raise ValueError(
            f"query_temperature of kind {kind!r} takes {list(names)}, got {sorted(given)}"
        )
    checked: dict[str, Any] = {"kind": str(kind)}
    for name in names:
        checked[name] = validation.finite_real(f"query_temperature[{name!r}]", spec[name])
    if checked["length"] <= 0:
        raise ValueError(f"query_temperature['length'] must be > 0, got {checked['length']}")
    if counted == "cache":
        checked["positions"] = "cache"
    return checked


def temperature_scale(positions: np.ndarray, spec: Mapping[str, Any]) -> np.ndarray:
    """t(p) of every position, float64, positions' shape ((N,) or (B, N))."""
    p = np.asarray(positions, dtype=np.float64) + spec["offset"]
    if spec["kind"] == "log_floor":
        return 1.0 + spec["beta"] * np.log1p(np.floor(p / spec["length"]))
    return np.exp(spec["exponent"] * np.log1p(p / spec["length"]))


class TemperatureCtx(NamedTuple):
    scale: np.ndarray  # t(p) in q's dtype, (N, 1) or (B, 1, N, 1), broadcast against q


def query_temperature_forward(
    q: np.ndarray, positions: np.ndarray, spec: Mapping[str, Any]
) -> tuple[np.ndarray, TemperatureCtx]:
    """q' = t(p) * q, row by row.

    Args:
        q: (B, H, N, D).
        positions: (N,) or (B, N), checked by the caller (``rope.check_positions``).
        spec: from ``check_temperature``.

    Returns:
        q' (B, H, N, D) in q's dtype and the ctx for ``query_temperature_backward``.
    """
    scale = temperature_scale(positions, spec).astype(q.dtype)[..., None]  # (N, 1) or (B, N, 1)
    if scale.ndim == 3:
        scale = scale[:, None]  # (B, N, 1) -> (B, 1, N, 1), against q (B, H, N, D)
    return q * scale, TemperatureCtx(scale)


def query_temperature_backward(dout: np.ndarray, ctx: TemperatureCtx) -> np.ndarray:
    """dq = t(p) * dq': the forward is a diagonal linear map, its own transpose.
    Derivation: docs/derivations/query-temperature.md.

    Args:
        dout: (B, H, N, D), the gradient of q'.
        ctx: from ``query_temperature_forward``.

    Returns:
        dq (B, H, N, D).
    """
    return dout * ctx.scale
