"""Per-layer LoRA adapters on a shared attention's q, k and v, folded into the projections.

Zamba2 ties one attention block across several layers and gives each layer that uses it its own
low-rank adapters (``use_shared_attention_adapter``): for the layer's slot s,

    q = x W_q^T + (x A_q,s^T) B_q,s^T      A_q,s (r, C_in), B_q,s (C_in, r), likewise k and v

with C_in the attention's input width. Both terms read the same x, so the layer's effective
weight is one matrix, W_q + B_q,s A_q,s (rows H*D = C_in: the adapter's output width is the
projection's, which needs H_kv = H for k and v). The fold is exact up to rounding (the sum is
taken over other orders: a few ulps in float64). It cannot be undone: W and B A are not
recoverable from their sum, and the shared W serves every layer of the block, so the way back
(``hf_attention_state_from_grouped``) refuses a config with adapters.

State-dict names (the attention module's): ``linear_{q,k,v}_adapter_list.{s}.0.weight`` (A) and
``.1.weight`` (B); a slot that belongs to another block is an ``nn.Identity`` without weights.

Derivation: docs/hugging-face.md ("zamba2"). Tests: tests/numpy_attention/hf/test_adapters.py;
against transformers in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

__all__ = ["ADAPTER_KEY", "fold_adapters"]

ADAPTER_KEY = re.compile(r"linear_([qkv])_adapter_list\.(\d+)\.([01])\.weight")


def fold_adapters(attention: Mapping[str, np.ndarray], slot: int) -> dict[str, np.ndarray]:
    """The entries with slot ``slot``'s adapters folded into q_proj, k_proj and v_proj
    (``W + B A``) and every adapter entry (this slot's and the other layers') removed.

    Args:
        attention: the attention module's entries, NumPy arrays.
        slot: the layer's adapter slot (its rank among the attention layers).

    Returns:
        a new dict without adapter entries.

    Raises:
        KeyError: the slot's A or B of q, k or v missing, named.
        ValueError: an adapter whose shapes do not compose with its projection, named.
    """
    folded = {key: value for key, value in attention.items() if not ADAPTER_KEY.fullmatch(key)}
    missing = [
        f"linear_{proj}_adapter_list.{slot}.{part}.weight"
        for proj in "qkv"
        for part in "01"
        if f"linear_{proj}_adapter_list.{slot}.{part}.weight" not in attention
    ]
    if missing:
        raise KeyError(f"the layer's adapter slot {slot} has no {missing}")
    for proj in "qkv":
        down = attention[f"linear_{proj}_adapter_list.{slot}.0.weight"]  # A (r, C_in)
        up = attention[f"linear_{proj}_adapter_list.{slot}.1.weight"]  # B (C_out, r)
        weight = attention[f"{proj}_proj.weight"]  # (C_out, C_in)
        if (
            up.shape[0] != weight.shape[0]
            or down.shape[1] != weight.shape[1]
            or (up.shape[1] != down.shape[0])
        ):
            raise ValueError(
                f"linear_{proj}_adapter_list.{slot} has shapes {down.shape} and {up.shape}, "
                f"which do not add to {proj}_proj.weight {weight.shape} (an adapter's output is "
                "attention_hidden_size wide: k and v need num_key_value_heads = "
                "num_attention_heads)"
            )
        folded[f"{proj}_proj.weight"] = weight + up @ down  # forward: x W^T + (x A^T) B^T
    return folded
