"""The query temperature in torch, the twin of ``numpy_attention.temperature``: the queries, after
RoPE, multiplied by a factor t(p) of the token's position alone.

    log_floor:  t(p) = 1 + beta * log(1 + floor((p + offset) / length))    Ministral 3, Llama 4
    power:      t(p) = (1 + (p + offset) / length) ** exponent              Beam

t is computed in float64 from the positions and cast to q's dtype, as in the NumPy twin.

Shape legend: B batch, H heads, N tokens, D head width.

Derivation: docs/derivations/query-temperature.md (the NumPy twin's backward; autograd here).
Tests: tests/torch_attention/test_grouped.py (in the layer, against the NumPy twin).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from numpy_attention.temperature import (  # the rules are pure Python, shared
    TEMPERATURE_KINDS,
    check_temperature,
)

__all__ = ["TEMPERATURE_KINDS", "check_temperature", "query_temperature", "temperature_scale"]


def temperature_scale(positions: torch.Tensor, spec: Mapping[str, Any]) -> torch.Tensor:
    """t(p) of every position, float64, positions' shape ((N,) or (B, N))."""
    p = positions.to(torch.float64) + spec["offset"]
    if spec["kind"] == "log_floor":
        return 1.0 + spec["beta"] * torch.log1p(torch.floor(p / spec["length"]))
    return torch.exp(spec["exponent"] * torch.log1p(p / spec["length"]))


def query_temperature(
    q: torch.Tensor, positions: torch.Tensor, spec: Mapping[str, Any]
) -> torch.Tensor:
    """q' = t(p) * q, row by row: q (B, H, N, D), positions (N,) or (B, N)."""
    scale = temperature_scale(positions, spec).to(q.dtype)[..., None]  # (N, 1) or (B, N, 1)
    if scale.ndim == 3:
        scale = scale[:, None]  # (B, N, 1) -> (B, 1, N, 1), against q (B, H, N, D)
    return q * scale
