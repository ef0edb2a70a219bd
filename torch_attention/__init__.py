"""torch_attention: the mirror of numpy_attention as torch.nn.Modules, on any device and dtype.

File for file and name for name the twin of ``numpy_attention``: the same layers, constructor
signatures and state-dict keys, with autograd (or, for the ``"manual"`` backend, the same
hand-derived backward) instead of hand-written layer backwards. As in ``numpy_attention``,
``torch_attention.attention`` is the module of the book family and the attention function is
``torch_attention.functional.attention``. docs/torch-backends.md describes the attention backends.

Shape legend used everywhere: B batch, H heads, N query length, M key/value length, C model
width, D head width, Dv value head width.

Tests: tests/torch_attention/ (one test file per module, test_X.py for X.py).
"""

from . import functional, fused, grouped, latent, masks, paged
from .attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    SimpleSelfAttention,
)
from .fused import BidirectionalAttention, CausalSelfAttention, CrossAttention, SingleHeadAttention
from .grouped import GroupedQueryAttention, KVCache
from .latent import MultiHeadLatentAttention
from .latent_cache import LatentCache, PagedLatentCache
from .layers import Dropout, Linear
from .merge import merge_attention
from .norms import LayerNorm, RMSNorm
from .paged import KVCacheOutput, PagedKVCache, kvcache_attention
from .rope import rope, rope_inv_freq
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
    "varlen",
    "varlen_attention",
    "paged",
    "KVCacheOutput",
    "PagedKVCache",
    "kvcache_attention",
]
