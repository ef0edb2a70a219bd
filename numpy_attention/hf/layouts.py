"""Where Hugging Face models keep their attention projections, and the layer's names for them:
separate ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (the Llama family: the same names), or
fused, split on load and joined on save.

- ``"qkv_proj"`` (Phi-3): ``qkv_proj.weight`` ((H + 2 H_kv) D, C), rows [all query heads; all
  key heads; all value heads], then ``o_proj``.
- ``"falcon"``: ``query_key_value.weight`` ((H + 2 H_kv) D, C) grouped per key/value head: for
  each kv head c, the g = H / H_kv query heads that read it, then k_c, then v_c (Falcon's
  ``_split_heads`` views it as (H_kv, g + 2, D)); an optional ``query_key_value.bias`` alike;
  ``dense`` is o_proj. Multi-query (one kv head) and multi-head (g = 1) Falcons are the same
  layout, and so is Persimmon's (always g = 1: (H, 3, D), per head [q_h; k_h; v_h]).
- ``"gpt_bigcode"`` (GPT-BigCode, StarCoder): ``c_attn.weight`` and ``c_attn.bias`` (an
  ``nn.Linear``, not GPT-2's transposed ``Conv1D``), then ``c_proj`` as o_proj. Multi-query,
  its rows are [all query heads; k; v] (the output split at H D and H D + D); multi-head, the
  output is viewed as (H, 3 D), per head [q_h; k_h; v_h]. Both are Falcon's grouping, with
  H_kv = 1 and with g = 1.
- ``"dbrx"``: ``Wqkv.weight`` ((H + 2 H_kv) D, C), rows [all query heads; all key heads; all
  value heads] as Phi-3's (DBRX splits its output at H D and H D + H_kv D), no bias;
  ``out_proj`` is o_proj.
- ``"q_gate"`` (Qwen3-Next, Qwen3.5): ``q_proj.weight`` (2 H D, C) carries the output gate's
  rows beside the queries', per head: head h's D query rows, then its D gate rows (the model
  views the projection as (..., H, 2 D) and chunks it), split into the layer's ``q_proj`` and
  ``g_proj``; an optional ``q_proj.bias`` (2 H D,) alike. k, v and o_proj are separate.

Every function is a linear re-arrangement of rows, so gradient dicts map through them like the
weights. NumPy only.

Tests: tests/numpy_attention/hf/test_layouts.py, test_grouped.py (the split and the join, a round
trip); against transformers' modules in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

ANCHORS = {  # the one key every layout's attention has, after which nothing is named
    "separate": "q_proj.weight",
    "qkv_proj": "qkv_proj.weight",
    "falcon": "query_key_value.weight",
    "gpt_bigcode": "c_attn.weight",
    "dbrx": "Wqkv.weight",
    "q_gate": "q_proj.weight",
}
EXAMPLES = {  # how a whole model's state dict names it
    "separate": "model.layers.{i}.self_attn.q_proj.weight",
    "qkv_proj": "model.layers.{i}.self_attn.qkv_proj.weight",
    "falcon": "transformer.h.{i}.self_attention.query_key_value.weight",
    "gpt_bigcode": "transformer.h.{i}.attn.c_attn.weight",
    "dbrx": "blocks.{i}.norm_attn_norm.attn.Wqkv.weight",
    "q_gate": "model.layers.{i}.self_attn.q_proj.weight",
}
_FUSED = {
    "qkv_proj": "qkv_proj",
    "falcon": "query_key_value",
    "gpt_bigcode": "c_attn",
    "dbrx": "Wqkv",
}
_OUT = {
    "separate": "o_proj",
    "qkv_proj": "o_proj",
    "falcon": "dense",
    "gpt_bigcode": "c_proj",
    "dbrx": "out_proj",
    "q_gate": "o_proj",
}
_STACKED = ("qkv_proj", "dbrx")  # fused rows [q heads; k heads; v heads]
_QKV = ("q_proj", "k_proj", "v_proj")
_Q_GATE = ("q_proj", "g_proj")  # the "q_gate" layout's two halves of the model's q_proj


def expected_form(layout: str) -> str:
    """The key forms a state dict of this layout is expected to have, for error messages."""
    return f"expected keys like '{EXAMPLES[layout]}' or '{ANCHORS[layout]}'"


def hf_name(layout: str, name: str) -> str:
    """The model's name of one of the layer's entries (the fused entry for q, k, v)."""
    module, _, kind = name.partition(".")
    if module in _QKV and layout in _FUSED:
        return f"{_FUSED[layout]}.{kind}"
    if module in _Q_GATE and layout == "q_gate":
        return f"q_proj.{kind}"
    if module == "o_proj":
        return f"{_OUT[layout]}.{kind}"
    return name


def hf_shapes(layout: str, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The model's entries and shapes for the layer's ``shapes`` (name -> shape): fused rows add
    up."""
    result: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        key = hf_name(layout, name)
        if key in result:  # q, k and v rows stacked into one entry
            result[key] = (result[key][0] + shape[0], *shape[1:])
        else:
            result[key] = tuple(shape)
    return result


def split(
    layout: str, state: Mapping[str, np.ndarray], num_heads: int, num_kv_heads: int
) -> dict[str, np.ndarray]:
    """The model's attention entries (its names) as the layer's: fused rows split into q, k and
    v, ``dense`` renamed ``o_proj``. Shapes are the caller's to have checked."""
    out: dict[str, np.ndarray] = {}
    for key, value in state.items():
        module, _, kind = key.partition(".")
        if layout in _FUSED and module == _FUSED[layout]:
            q, k, v = _split_rows(layout, value, num_heads, num_kv_heads)
            out |= {f"q_proj.{kind}": q, f"k_proj.{kind}": k, f"v_proj.{kind}": v}
        elif layout == "q_gate" and module == "q_proj":
            rest = value.shape[1:]
            per_head = value.reshape(num_heads, 2, -1, *rest)  # (2 H D, ...) -> (H, 2, D, ...)
            out[f"q_proj.{kind}"] = per_head[:, 0].reshape(-1, *rest)  # (H, D, ...) -> (H D, ...)
            out[f"g_proj.{kind}"] = per_head[:, 1].reshape(-1, *rest)
        elif module == _OUT[layout]:
            out[f"o_proj.{kind}"] = value
        else:
            out[key] = value
    return out


def join(
    layout: str, state: Mapping[str, np.ndarray], num_heads: int, num_kv_heads: int
) -> dict[str, np.ndarray]:
    """The layer's entries (its names) as the model's: ``split``'s inverse."""
    out: dict[str, np.ndarray] = {}
    for key, value in state.items():
        module, _, kind = key.partition(".")
        if layout in _FUSED and module in _QKV:
            if module == "q_proj":
                parts = [state[f"{name}.{kind}"] for name in _QKV]
                out[f"{_FUSED[layout]}.{kind}"] = _join_rows(layout, parts, num_heads, num_kv_heads)
        elif layout == "q_gate" and module in _Q_GATE:
            if module == "q_proj":
                q, g = state[f"q_proj.{kind}"], state[f"g_proj.{kind}"]
                rest = q.shape[1:]
                halves = [part.reshape(num_heads, 1, -1, *rest) for part in (q, g)]
                fused = np.concatenate(halves, axis=1)  # (H, 2, D, ...): per head, q then g
                out[f"q_proj.{kind}"] = fused.reshape(-1, *rest)
        elif module == "o_proj":
            out[f"{_OUT[layout]}.{kind}"] = value
        else:
            out[key] = value
    return out


def _split_rows(
    layout: str, fused: np.ndarray, num_heads: int, num_kv_heads: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v rows of a fused weight ((H + 2 H_kv) D, C) or bias ((H + 2 H_kv) D,)."""
    rest = fused.shape[1:]
    if layout in _STACKED:  # [q heads; k heads; v heads]
        head_dim = fused.shape[0] // (num_heads + 2 * num_kv_heads)
        q_rows, kv_rows = num_heads * head_dim, num_kv_heads * head_dim
        q, k, v = np.split(fused, [q_rows, q_rows + kv_rows])
        return q.copy(), k.copy(), v.copy()
    group = num_heads // num_kv_heads  # Falcon, GPT-BigCode: per kv head, its g query heads, k, v
    blocks = fused.reshape(num_kv_heads, group + 2, -1, *rest)  # (H_kv, g + 2, D, ...)
    q = blocks[:, :group].reshape(-1, *rest)  # (H_kv, g, D, ...) -> (H D, ...)
    k = blocks[:, group].reshape(-1, *rest)  # (H_kv, D, ...) -> (H_kv D, ...)
    v = blocks[:, group + 1].reshape(-1, *rest)
    return q, k, v


def _join_rows(
    layout: str, parts: list[np.ndarray], num_heads: int, num_kv_heads: int
) -> np.ndarray:
    """``_split_rows``'s inverse: q (H D, ...), k and v (H_kv D, ...) as one fused entry."""
    q, k, v = parts
    if layout in _STACKED:
        return np.concatenate([q, k, v])
    rest = q.shape[1:]
    group = num_heads // num_kv_heads
    blocks = [
        q.reshape(num_kv_heads, group, -1, *rest),  # (H_kv, g, D, ...)
        k.reshape(num_kv_heads, 1, -1, *rest),
        v.reshape(num_kv_heads, 1, -1, *rest),
    ]
    return np.concatenate(blocks, axis=1).reshape(-1, *rest)  # (H_kv, g + 2, D, ...) -> rows
