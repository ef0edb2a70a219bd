"""torch_attention: the mirror of numpy_attention as torch.nn.Modules, on any device and dtype.

File for file and name for name the twin of ``numpy_attention``: the same layers, constructor
signatures and state-dict keys, with autograd (or, for the ``"manual"`` backend, the same
hand-derived backward) instead of hand-written layer backwards. As in ``numpy_attention``,
``torch_attention.attention`` is the module of the book family and the attention function is
``torch_attention.functional.attention``. docs/torch-backends.md describes the attention backends.

Shape legend used everywhere: B batch, H heads, N query length, M key/value length, C model
width, D head width, Dv value head width.

Decoding lives in ``decode/`` (the decode call, its checks, pages and a layer's caches), as in
the NumPy twin; the Hugging Face readers are NumPy's alone (``numpy_attention.hf``: a converted
layer moves to torch through ``from_numpy`` and the state dict). Context parallelism, the Triton
kernel and flash-attn's signatures (``distributed.py``, ``triton/``, ``flash_api.py``) have no
NumPy twin.

Tests: tests/torch_attention/ (mirroring the source tree: test_X.py for X.py, decode/ and
triton/ for the subpackages).
"""

import importlib
import sys

from . import decode, functional, fused, grouped, latent, masks, rules
from .attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    SimpleSelfAttention,
)
from .decode.cache import KVCache, PagedKVCache
from .decode.paged import KVCacheOutput, kvcache_attention
from .decode.prefill import PrefillOutput, cascade_prefill, paged_prefill
from .decode.serving import (
    PagedPrefillWrapper,
    csr_block_table,
    flashinfer_paged,
    merge_state,
    merge_states,
    vllm_paged,
)
from .fused import BidirectionalAttention, CausalSelfAttention, CrossAttention, SingleHeadAttention
from .gated_deltanet import GatedDeltaNet
from .grouped import GroupedQueryAttention
from .kimi_delta import KimiDeltaAttention, KimiForgetGate
from .latent import MultiHeadLatentAttention
from .latent_cache import LatentCache, PagedLatentCache
from .layers import Dropout, Linear
from .lightning import LightningAttention
from .linear_attention import LinearOutput, gated_delta_rule, kda, simple_gla
from .linear_cache import LinearStateCache, PagedLinearStateCache
from .merge import merge_attention
from .moba import moba
from .norms import LayerNorm, RMSNorm, WeightlessRMSNorm
from .nsa import nsa
from .rope import rope, rope_inv_freq
from .sparse import sparse_attention
from .transfer import from_numpy, to_numpy
from .varlen import varlen_attention

__all__ = [
    "BidirectionalAttention",
    "CausalAttention",
    "CausalSelfAttention",
    "CrossAttention",
    "Dropout",
    "GroupedQueryAttention",
    "KVCache",
    "LatentCache",
    "PagedLatentCache",
    "Linear",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "LayerNorm",
    "MultiHeadLatentAttention",
    "RMSNorm",
    "WeightlessRMSNorm",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "SimpleSelfAttention",
    "SingleHeadAttention",
    "from_numpy",
    "functional",
    "fused",
    "grouped",
    "latent",
    "masks",
    "merge",
    "merge_attention",
    "rope",
    "rope_inv_freq",
    "to_numpy",
    "sparse_attention",
    "moba",
    "nsa",
    "gated_delta_rule",
    "kda",
    "simple_gla",
    "LinearOutput",
    "GatedDeltaNet",
    "KimiDeltaAttention",
    "KimiForgetGate",
    "LightningAttention",
    "LinearStateCache",
    "PagedLinearStateCache",
    "varlen",
    "varlen_attention",
    "decode",
    "rules",
    "KVCacheOutput",
    "PagedKVCache",
    "kvcache_attention",
    "PagedPrefillWrapper",
    "PrefillOutput",
    "cascade_prefill",
    "csr_block_table",
    "flashinfer_paged",
    "merge_state",
    "merge_states",
    "paged_prefill",
    "vllm_paged",
]

# The documented module paths of before the decode/ subpackage (README.md and docs/ named them),
# kept for users: each old dotted name is registered in sys.modules as the new module itself,
# and set as an attribute of the package. The project's own code never imports them
# (tests/torch_attention/test_layout.py checks both).
_MOVED = {
    "paged": "decode.paged",
    "pages": "decode.pages",
    "paged_cache": "decode.cache",
    "paged_checks": "decode.checks",
}
for _old, _new in _MOVED.items():
    sys.modules[f"{__name__}.{_old}"] = globals()[_old] = importlib.import_module(
        f"{__name__}.{_new}"
    )
del _old, _new
