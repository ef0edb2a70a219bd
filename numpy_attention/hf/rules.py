"""The rules several row modules (``rows/``) share: a hybrid's list of layer types read in words,
"no RoPE at all", and StableLM's check that ``head_dim`` agrees with the width its attention
computes, SmolLM 3's NoPE layers (Llama 4's reuse them) and Gemma 3's layer pattern (Gemma
3n's). A rule only one module's rows name sits in that module, beside its rows. NumPy only.

Tests: through the rows that name them, tests/numpy_attention/hf/rows/ and test_families.py;
against transformers in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .family import Family, required


def _kinds(types: Any, key: str, names: Mapping[str, str]) -> list[str]:
    """A list of layer types (read from ``key``) in words (``names``); a type the model's code
    has no layer for is refused by name."""
    kinds = []
    for i, kind in enumerate(types):
        if kind not in names:
            raise ValueError(f"{key}[{i}] is {kind!r}; this model knows {sorted(names)}")
        kinds.append(names[kind])
    return kinds


def _never(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Jamba's and Nemotron-H's attention: no RoPE at all (the Mamba layers carry position);
    GPT-BigCode's (its learned position embeddings are added to the input, outside it)."""
    return False


# StableLM (and Mllama's text model, ModernBERT decoder, Persimmon): its attention's head width is
# hidden_size // num_attention_heads whatever head_dim says, and its rotary embedding reads
# head_dim: the two must agree
def _stablelm_refuse(config: Mapping[str, Any]) -> None:
    head_dim = config.get("head_dim")
    width = required(config, "hidden_size") // required(config, "num_attention_heads")
    if head_dim is not None and head_dim != width:
        raise ValueError(
            f"head_dim is {head_dim}, but {config.get('model_type', 'stablelm')}'s attention "
            f"heads are hidden_size // num_attention_heads = {width} wide (its rotary embedding "
            f"would read {head_dim})"
        )


def _smollm3_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """SmolLM 3: ``no_rope_layers[i]`` is 1 where layer i uses RoPE; without the list, every
    ``no_rope_layer_interval``-th layer (4 by default) is a NoPE layer."""
    flags = config.get("no_rope_layers")
    if flags is None:
        return bool((layer_idx + 1) % (config.get("no_rope_layer_interval") or 4))
    if layer_idx >= len(flags):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's no_rope_layers has {len(flags)} entries"
        )
    return bool(flags[layer_idx])


def _pattern(default: int) -> Callable[[Mapping[str, Any], int], bool]:
    """Gemma 3's and Cohere 2's: every layer but each ``sliding_window_pattern``-th slides."""

    def sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
        return bool((layer_idx + 1) % (config.get("sliding_window_pattern") or default))

    return sliding
