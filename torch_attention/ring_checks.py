"""The inputs of ring attention and of ``gather_sequence`` checked: each rank's own checks,
made before any communication (dtypes, layouts, shards of one length, and the core's checks of
attention through ``rules.prepare``), and the row of metadata every rank contributes
(``ring_row``, column by column ``RING_FIELDS``), which ``check_agreement`` compares across the
ranks: shards of another shape or dtype, or other options, on any rank are an error on every
rank, naming each rank's values.

Shape legend: B batch, H query heads, H_kv key/value heads, n positions per rank, D head width,
Dv value head width, W ranks.

Tests: tests/torch_attention/test_distributed.py (every refusal, on one rank and across ranks).
"""

from __future__ import annotations

from typing import Any

import torch

from .rules import ScoreRules, prepare

LAYOUTS = ("contiguous", "zigzag")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_NDIM = 8
# The metadata row of ring_attention, column by column.
RING_FIELDS = (
    *(f"q.shape[{i}]" for i in range(4)),
    *(f"k.shape[{i}]" for i in range(4)),
    *(f"v.shape[{i}]" for i in range(4)),
    "dtype",
    "causal",
    "scale",
    "softcap",
    "left",  # the visible band, window and causal together
    "right",
    "layout",
    "backward",  # whether this rank's call records a backward (grad mode, inputs needing grad)
)


def check_layout(layout: Any) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def check_dtype(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {tensor.dtype}")


def check_zigzag_length(layout: str, length: int, name: str, shape: tuple[int, ...]) -> None:
    if layout == "zigzag" and length % 2 != 0:
        raise ValueError(
            f"layout 'zigzag' splits the sequence into 2W equal chunks, two per rank, so every "
            f"shard holds an even number of positions; got {length} ({name} {shape})"
        )


def check_ring_inputs(
    q: Any,
    k: Any,
    v: Any,
    causal: Any,
    scale: Any,
    softcap: Any,
    window: Any,
    enable_gqa: Any,
    layout: Any,
) -> ScoreRules:
    """This rank's own checks of ``ring_attention``'s inputs, before any communication: the
    core's checks of attention (``rules.prepare``, its messages), then what a ring adds (4-D
    shards of one length); the rules of the call."""
    rules = prepare(
        q, k, v, causal=causal, window=window, scale=scale, softcap=softcap, enable_gqa=enable_gqa
    ).rules
    check_dtype("q", q)
    if len({t.device for t in (q, k, v)}) > 1:
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    if q.ndim != 4 or k.ndim != 4 or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q (B, H, n, D), k (B, H_kv, n, D) and v (B, H_kv, n, Dv) must be shards of one "
            f"length n (self-attention, N = M), got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    check_layout(layout)
    check_zigzag_length(layout, q.shape[2], "q", tuple(q.shape))
    return rules


def ring_row(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules, causal: bool, layout: str
) -> list[float]:
    """This rank's metadata, in the order of ``RING_FIELDS`` (an unbounded side as -1)."""
    return [
        *(float(s) for t in (q, k, v) for s in t.shape),
        float(DTYPES.index(q.dtype)),
        float(causal),
        rules.scale,
        rules.softcap,
        -1.0 if rules.left is None else float(rules.left),
        -1.0 if rules.right is None else float(rules.right),
        float(LAYOUTS.index(layout)),
        float(torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))),
    ]


def check_agreement(table: torch.Tensor) -> None:
    """``ValueError`` (``TypeError`` for dtypes) on every rank unless all rows agree."""
    differ = [
        name for i, name in enumerate(RING_FIELDS) if not bool((table[:, i] == table[0, i]).all())
    ]
    if not differ:
        return
    ranks = range(len(table))
    if differ == ["dtype"]:
        listed = ", ".join(f"rank {r} {DTYPES[int(table[r, 12])]}" for r in ranks)
        raise TypeError(f"ring_attention: every rank must pass one dtype, got {listed}")
    if any(name.startswith(("q.", "k.", "v.")) for name in differ):
        listed = "; ".join(
            f"rank {r}: q {shape_of(table[r, 0:4])}, k {shape_of(table[r, 4:8])}, "
            f"v {shape_of(table[r, 8:12])}"
            for r in ranks
        )
        raise ValueError(f"ring_attention: the shards differ in shape across the ranks: {listed}")
    columns = [RING_FIELDS.index(name) for name in differ]
    listed = "; ".join(
        f"rank {r}: "
        + ", ".join(f"{RING_FIELDS[i]} {_option(i, float(table[r, i]))}" for i in columns)
        for r in ranks
    )
    hint = (
        " (the backward is a ring too: every rank must run it, or none)"
        if "backward" in differ
        else ""
    )
    raise ValueError(f"ring_attention: every rank must pass the same options, got {listed}{hint}")


def _option(column: int, value: float) -> Any:
    """A column of the metadata row as the option was given."""
    name = RING_FIELDS[column]
    if name == "layout":
        return LAYOUTS[int(value)]
    if name in ("causal", "backward"):
        return bool(value)
    if name in ("left", "right"):
        return None if value < 0 else int(value)
    return value


def shape_of(row: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in row.tolist() if s >= 0)
