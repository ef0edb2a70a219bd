"""Hugging Face checkpoints read into this package's layers and written back, NumPy only
(transformers is never imported): decoder attention of the Llama family and its relatives into
``GroupedQueryAttention`` (``grouped.py``), DeepSeek's multi-head latent attention into
``MultiHeadLatentAttention`` (``latent.py``).

- ``families.py``: what each family's attention reads from its config, one row per
  ``model_type``, joined from ``rows/`` (``classic``, ``fused``, ``hybrids``, ``gated``,
  ``twists``: each module's rows beside the rules they name: which layers slide, rotate, are
  attention);
  ``family.py`` the machinery every row shares (the ``Family`` dataclass, the layer options),
  ``rules.py`` the few rules several row modules share,
  ``refused.py`` the model types refused by name with their reasons;
- ``rope.py``: RoPE's parameters, frequencies and attention factor as the model computes them;
- ``layouts.py``: where each layout keeps q, k, v and o (fused projections split and joined).

The names below are the readers' public API (``numpy_attention.hf.<name>``; the layout
converters also offer ``grouped_from_hf`` and ``latent_from_hf`` as ``convert.<name>``).
docs/hugging-face.md walks through each model.

Tests: tests/numpy_attention/hf/ (one test file per module, test_X.py for X.py); against
transformers in tests/parity/test_hf_models.py and tests/parity/test_hf_latent.py.
"""

from .families import SUPPORTED_MODEL_TYPES, kv_source_layer
from .gated_deltanet import gated_deltanet_from_hf
from .grouped import (
    grouped_from_hf,
    hf_attention_state,
    hf_attention_state_from_grouped,
    padding_from_hf,
)
from .kimi_delta import kimi_delta_from_hf
from .latent import latent_from_hf
from .lightning import lightning_from_hf
from .rope import ROPE_TYPES, hf_inv_freq, hf_rope_attention_factor

__all__ = [
    "ROPE_TYPES",
    "SUPPORTED_MODEL_TYPES",
    "grouped_from_hf",
    "hf_attention_state",
    "hf_attention_state_from_grouped",
    "hf_inv_freq",
    "hf_rope_attention_factor",
    "gated_deltanet_from_hf",
    "kimi_delta_from_hf",
    "kv_source_layer",
    "latent_from_hf",
    "lightning_from_hf",
    "padding_from_hf",
]
