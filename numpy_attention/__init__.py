"""numpy_attention: attention layers in NumPy alone, each forward beside its hand-derived backward.

A strict stack of floors, each importing only the floors below it (docs/design.md, "Layout"):
validation and grad mode -> masks, the rules of a call (``rules.py``) and the score pipeline
(``scores.py``) -> the dense and tiled paths (``functional.py``, ``tiled.py``, ``merge.py``,
``varlen.py``) -> the layers floor (``layers.py``, ``rope.py``, ``norms.py``) and decoding
(``decode/``: the decode reference, its checks, pages and a layer's caches) -> the layer
families (``attention.py``, ``fused.py``, ``grouped.py``, ``latent.py`` with
``latent_cache.py``) -> tools (``gradcheck.py``, ``state.py``, ``hf/`` the Hugging Face
readers, ``convert.py`` with ``source_dicts.py``).

Shape legend used everywhere: B batch, H heads, N query length, M key/value length, C model
width, D head width, Dv value head width.

Tests: tests/numpy_attention/ (mirroring the source tree: test_X.py for X.py, decode/ and hf/
for the subpackages).
"""

import importlib
import sys

from . import (
    convert,
    decode,
    functional,
    fused,
    grouped,
    hf,
    indexer,
    latent,
    latent_cache,
    linear_attention,
    masks,
    merge,
    moba,
    norms,
    nsa,
    rope,
    rules,
    scores,
    sparse,
    state,
    threads,
    tiled,
    varlen,
)
from .attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    SimpleSelfAttention,
)
from .decode.cache import KVCache, PagedKVCache
from .decode.paged import KVCacheOutput, kvcache_attention_forward
from .decode.prefill import PrefillOutput, cascade_prefill_forward, paged_prefill_forward
from .decode.serving import (
    csr_block_table,
    flashinfer_paged_forward,
    merge_state,
    merge_states,
    vllm_paged_forward,
)
from .functional import attention_backward, attention_forward
from .fused import BidirectionalAttention, CausalSelfAttention, CrossAttention, SingleHeadAttention
from .gated_deltanet import GatedDeltaNet
from .grad_mode import is_grad_enabled, no_grad
from .gradcheck import GradcheckReport, gradcheck
from .grouped import GroupedQueryAttention
from .kimi_delta import KimiDeltaAttention, KimiForgetGate
from .latent import MultiHeadLatentAttention
from .latent_cache import LatentCache, PagedLatentCache
from .layers import Dropout, Linear
from .lightning import LightningAttention
from .linear_attention import (
    LinearGrads,
    LinearOutput,
    gated_delta_rule_backward,
    gated_delta_rule_forward,
    kda_backward,
    kda_forward,
    simple_gla_backward,
    simple_gla_forward,
)
from .linear_cache import LinearStateCache, PagedLinearStateCache
from .merge import merge_attention_backward, merge_attention_forward
from .moba import moba_backward, moba_forward
from .module import Module, ModuleList
from .norms import LayerNorm, RMSNorm, WeightlessRMSNorm
from .nsa import nsa_backward, nsa_forward
from .rope import rope_backward, rope_forward, rope_inv_freq
from .scores import AttentionGrads, AttentionOutput
from .sparse import sparse_attention_backward, sparse_attention_forward
from .state import load_module, save_module
from .varlen import varlen_attention_backward, varlen_attention_forward

__all__ = [
    "AttentionGrads",
    "AttentionOutput",
    "merge",
    "merge_attention_backward",
    "merge_attention_forward",
    "indexer",
    "scores",
    "sparse",
    "sparse_attention_backward",
    "sparse_attention_forward",
    "linear_attention",
    "LinearGrads",
    "LinearOutput",
    "GatedDeltaNet",
    "KimiDeltaAttention",
    "KimiForgetGate",
    "LightningAttention",
    "LinearStateCache",
    "PagedLinearStateCache",
    "gated_delta_rule_backward",
    "gated_delta_rule_forward",
    "kda_backward",
    "kda_forward",
    "simple_gla_backward",
    "simple_gla_forward",
    "moba",
    "moba_backward",
    "moba_forward",
    "nsa",
    "nsa_backward",
    "nsa_forward",
    "threads",
    "varlen",
    "varlen_attention_backward",
    "varlen_attention_forward",
    "BidirectionalAttention",
    "CausalSelfAttention",
    "CrossAttention",
    "SingleHeadAttention",
    "convert",
    "fused",
    "hf",
    "CausalAttention",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "SimpleSelfAttention",
    "Dropout",
    "GradcheckReport",
    "Linear",
    "Module",
    "ModuleList",
    "attention_backward",
    "attention_forward",
    "functional",
    "gradcheck",
    "is_grad_enabled",
    "masks",
    "no_grad",
    "tiled",
    "state",
    "save_module",
    "load_module",
    "grouped",
    "norms",
    "rope",
    "GroupedQueryAttention",
    "KVCache",
    "LayerNorm",
    "latent",
    "LatentCache",
    "PagedLatentCache",
    "latent_cache",
    "MultiHeadLatentAttention",
    "RMSNorm",
    "WeightlessRMSNorm",
    "rope_backward",
    "rope_forward",
    "rope_inv_freq",
    "decode",
    "rules",
    "KVCacheOutput",
    "PagedKVCache",
    "kvcache_attention_forward",
    "PrefillOutput",
    "cascade_prefill_forward",
    "csr_block_table",
    "flashinfer_paged_forward",
    "merge_state",
    "merge_states",
    "paged_prefill_forward",
    "vllm_paged_forward",
]

# The documented module paths of before the decode/ and hf/ subpackages (README.md and docs/
# named them), kept for users: each old dotted name is registered in sys.modules as the new
# module itself, and set as an attribute of the package. The project's own code never imports
# them (tests/numpy_attention/test_layout.py checks both).
_MOVED = {
    "paged": "decode.paged",
    "pages": "decode.pages",
    "paged_cache": "decode.cache",
    "paged_checks": "decode.checks",
    "hf_families": "hf.families",
    "hf_layouts": "hf.layouts",
    "hf_rope": "hf.rope",
    "hf_latent": "hf.latent",
}
for _old, _new in _MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = globals()[_old] = importlib.import_module(
        f"{__name__}.{_new}"
    )
del _old, _new
