"""The factors of the attention cases (``battery.attention.case``): the ways such a case varies,
the values of each that matter to a kernel, the rules on which values one case can hold, and
how a case's values are read back from its fields.

A *factor* is one way a case varies (causal or not, the mask, the GQA grouping, where q, k, v
sit in memory ...) and its *values* are the ones that matter to a kernel: each takes another
code path, or breaks where another value does not. Each attention spec (``checker.specs``)
names the factors its signature can express (``AttentionSpec.factor_names``); a kernel that
claims fewer features has the unclaimed ones held at their first value, "off". ``allowed`` says
which values cannot meet in one case: a softcap is only bent by sharp logits; under causal a
window's right side is moot; heavy-tailed inputs at sharp logits overflow the plain
half-precision baseline (q k^T reaches 1e5 before the scale: a stress condition, the stress
battery's heavy-logits-100); an alignment exists only where positions matter (causal, a window
or ALiBi with N != M; ``NA`` elsewhere, never part of a pair). A spec adds rules of its own
(SDPA takes a mask or is_causal, not both).

Tests: tests/checker/battery/test_pairs.py
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

NA = "-"  # the value of a factor that does not apply to a case (an alignment without positions)

FACTORS: dict[str, tuple[str, ...]] = {
    "lengths": ("n<m", "n=m", "n>m"),
    "causal": ("off", "on"),
    "align": ("top-left", "bottom-right"),
    "window": ("none", "left", "two-sided"),
    "softcap": ("off", "on"),
    "alibi": ("none", "per-head", "per-batch"),
    "mask": ("none", "bool", "float", "dead-bool", "dead-float", "shifted"),
    "gqa": ("mha", "gqa", "mqa"),
    "dv": ("equal", "smaller", "larger"),
    "dropout": ("off", "on"),
    "scale": ("default", "given"),
    "inputs": ("gauss", "heavy", "outliers", "correlated"),
    "logits": ("normal", "sharp"),
    "memory": ("contiguous", "fused", "kv-strides", "offset", "broadcast"),
    "sequences": ("batched", "packed"),
    "layout": ("contiguous", "zigzag"),
}
# The features that turn a factor of the same name on (lse is a tensor every case judges).
FEATURE_FACTORS = ("mask", "causal", "dropout", "gqa", "window", "softcap", "alibi", "dv")
# The factors ``allowed`` reads; the others are free, so a row is complete once these are.
CONSTRAINED = (
    "causal", "mask", "window", "softcap", "logits", "inputs", "alibi", "lengths", "align"
)  # fmt: skip


def domains(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The values of each named factor; the align factor also has ``NA``."""
    return {name: FACTORS[name] + ((NA,) if name == "align" else ()) for name in names}


def allowed(names: tuple[str, ...], row: Mapping[str, str]) -> bool:
    """The rules of every attention spec whose factors are ``names``: False when the values
    assigned so far in ``row`` cannot be held by one case (unassigned factors are not judged)."""
    get = row.get
    if get("softcap") == "on" and get("logits") == "normal":
        return False  # a cap of 5 on scores of spread 1 bends nothing
    if get("inputs") in ("heavy", "outliers") and get("logits") == "sharp":
        return False  # plain half precision overflows there: the stress battery's business
    if get("window") == "two-sided" and get("causal") == "on":
        return False  # causal already hides everything right of p_i
    if "align" in row:
        positioned = _positioned(names, row)
        if positioned is not None and (row["align"] != NA) != positioned:
            return False
    return True


def _positioned(names: tuple[str, ...], row: Mapping[str, str]) -> bool | None:
    """Whether the row's query positions matter (causal, a window or ALiBi, with N != M);
    None while that depends on factors not yet assigned."""
    rules = [row.get(f) for f in ("causal", "window", "alibi") if f in names]
    uses = [value not in (None, "off", "none") for value in rules]
    lengths = row.get("lengths")
    if lengths == "n=m" or (all(value is not None for value in rules) and not any(uses)):
        return False
    if lengths is not None and any(uses):
        return True
    return None


def case_values(names: tuple[str, ...], case: Any) -> dict[str, str]:
    """The value of each factor of ``names`` that ``case`` (a ``battery.attention.case.Case``)
    holds, read from its fields (a value outside a factor's values, such as a right-only window,
    is kept as it is and meets no required pair)."""
    n, m = case.lengths[0] if case.lengths else (case.n, case.m)
    left, right = case.window if case.window is not None else (None, None)
    window = "none"
    if left is not None:
        window = "left" if right in (None, 0) or case.causal else "two-sided"
    elif right is not None:
        window = "right"
    kv, heads = case.kv_heads, case.heads
    dv = case.value_width
    values = {
        "lengths": "n<m" if n < m else "n=m" if n == m else "n>m",
        "causal": "on" if case.causal else "off",
        "align": case.align if case.positioned else NA,
        "window": window,
        "softcap": "on" if case.softcap else "off",
        "alibi": {"none": "none", "H": "per-head", "BH": "per-batch"}[case.alibi],
        "mask": case.mask,
        "gqa": "mha" if kv == heads else "mqa" if kv == 1 else "gqa",
        "dv": "equal" if dv == case.d else "smaller" if dv < case.d else "larger",
        "dropout": "on" if case.dropout_p else "off",
        "scale": "default" if case.scale is None else "given",
        "inputs": case.inputs,
        "logits": "sharp" if case.logits >= 10 else "normal",
        "memory": case.memory,
        "sequences": "packed" if case.packed else "batched",
        "layout": case.layout,
    }
    return {factor: values[factor] for factor in names}
