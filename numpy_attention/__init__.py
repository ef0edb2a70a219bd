"""numpy_attention: attention layers in NumPy alone, each forward beside its hand-derived backward.

Shape legend used everywhere: B batch, H heads, N query length, M key/value length, C model
width, D head width, Dv value head width.
"""

from . import (
    convert,
    functional,
    fused,
    grouped,
    hf,
    hf_latent,
    latent,
    latent_cache,
    masks,
    merge,
    norms,
    paged,
    paged_cache,
    paged_checks,
    pages,
    rope,
    scores,
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
from .functional import attention_backward, attention_forward
from .fused import BidirectionalAttention, CausalSelfAttention, CrossAttention, SingleHeadAttention
from .grad_mode import is_grad_enabled, no_grad
from .gradcheck import GradcheckReport, gradcheck
from .grouped import GroupedQueryAttention, KVCache
from .latent import MultiHeadLatentAttention
from .latent_cache import LatentCache, PagedLatentCache
from .layers import Dropout, Linear
from .merge import merge_attention_backward, merge_attention_forward
from .module import Module, ModuleList
from .norms import LayerNorm, RMSNorm
from .paged import KVCacheOutput, PagedKVCache, kvcache_attention_forward
from .rope import rope_backward, rope_forward, rope_inv_freq
from .scores import AttentionGrads, AttentionOutput
from .state import load_module, save_module
from .varlen import varlen_attention_backward, varlen_attention_forward

__all__ = [
    "AttentionGrads",
    "AttentionOutput",
    "merge",
    "merge_attention_backward",
    "merge_attention_forward",
    "scores",
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
    "hf_latent",
    "LatentCache",
    "PagedLatentCache",
    "latent_cache",
    "MultiHeadLatentAttention",
    "RMSNorm",
    "rope_backward",
    "rope_forward",
    "rope_inv_freq",
    "paged",
    "paged_cache",
    "paged_checks",
    "pages",
    "KVCacheOutput",
    "PagedKVCache",
    "kvcache_attention_forward",
]
