"""State-dict layout converters, NumPy only, so the CPU fallback can load every layout.

Each converter takes a mapping name -> array-like (NumPy arrays, lists, or torch tensors, read
through ``.detach().cpu()`` without importing torch) and returns a new dict of fresh C-contiguous
``np.ndarray`` copies, in the dtype they came in. All of them are linear re-arrangements of the
weights (stacking, slicing, transposing), so a gradient dict (``module.named_grads()``) maps through
the same function as the parameters do.

Rules shared by all converters:

- A missing required key raises ``KeyError`` naming it; an unexpected key raises ``KeyError`` too,
  since ignoring it would drop weights silently. Inconsistent shapes raise ``ValueError``.
- A bias the source lacks but the target layout requires becomes zeros (the layer computes the
  same thing). A bias the target cannot hold is dropped only when it is all zeros; otherwise the
  conversion raises ``ValueError``.
- Buffers are optional inputs (gradient dicts have none). The book's causal ``mask`` buffer is
  ``triu(ones(L, L), diagonal=1)``: it is checked and dropped where the target has no buffer (the
  fused family builds its causal mask per call) and rebuilt where the target needs one and the
  caller passes ``context_length``.

Layouts (legend: C model width, H heads, D = C // H head width, L context length):

- SelfAttentionV1: ``W_query, W_key, W_value`` (d_in, d_out).
- SelfAttentionV2: ``W_query.weight`` (d_out, d_in), optional ``W_query.bias`` (d_out,), same for
  key and value.
- MultiHeadAttentionWrapper: ``heads.{h}.W_query.weight`` (D, d_in) ... and ``heads.{h}.mask``.
- MultiHeadAttention (the "separate" layout): ``W_query/W_key/W_value.weight`` (d_out, d_in),
  optional ``.bias``, ``out_proj.weight`` (d_out, d_out), ``out_proj.bias``, buffer ``mask``.
- Fused self (SingleHead/Bidirectional/CausalSelfAttention): ``Wqkv.weight`` (3C, C) with rows
  [query heads; key heads; value heads], ``Wo.weight`` (C, C), optional ``.bias``.
- Fused cross (CrossAttention): ``Wq.weight`` (C, C), ``Wkv.weight`` (2C, C) with rows
  [key heads; value heads], ``Wo.weight`` (C, C), optional ``.bias``.
- ``torch.nn.MultiheadAttention``: ``in_proj_weight`` (3C, C) = [Wq; Wk; Wv], ``in_proj_bias``,
  ``out_proj.weight``, ``out_proj.bias`` (both biases present or both absent).
- GPT-2 ``Conv1D`` (y = x W + b, weights stored (in, out)): ``c_attn.weight`` (C, 3C),
  ``c_attn.bias``, ``c_proj.weight`` (C, C), ``c_proj.bias``; its cross-attention has
  ``q_attn.weight`` (C, C), ``q_attn.bias`` and ``c_attn.weight`` (C, 2C) for keys and values.

``save_state`` / ``load_state`` (``.npz`` files) live in ``numpy_attention.state`` and are
importable from here too, as are ``grouped_from_hf`` and ``hf_attention_state`` (Hugging Face's
Llama-family attention -> ``GroupedQueryAttention``, in ``numpy_attention.hf.grouped``) and
``latent_from_hf`` (DeepSeek's MLA, in ``numpy_attention.hf.latent``), and the readers of the
linear-attention layers: ``gated_deltanet_from_hf`` (Qwen3-Next's and Qwen3.5's gated DeltaNet,
``numpy_attention.hf.gated_deltanet``), ``kimi_delta_from_hf`` (Kimi Linear's KDA,
``numpy_attention.hf.kimi_delta``) and ``lightning_from_hf`` (MiniMax's lightning attention,
``numpy_attention.hf.lightning``). The rules shared by all converters are applied by
``source_dicts.py``. Layouts and decisions: docs/weight-transfer.md.

Tests: tests/numpy_attention/test_convert.py; against torch and transformers in
tests/parity/test_transfers.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import masks, validation

# Documented with the layouts (README.md, docs/cpu-fallback.md, docs/hugging-face.md,
# docs/state-files.md), so users find every conversion in one module: Hugging Face's readers
# build layers, so they live in numpy_attention.hf, and the .npz state files in
# numpy_attention.state; the project's own code imports them from there.
from .hf.gated_deltanet import gated_deltanet_from_hf as gated_deltanet_from_hf
from .hf.grouped import grouped_from_hf as grouped_from_hf
from .hf.grouped import hf_attention_state as hf_attention_state
from .hf.kimi_delta import kimi_delta_from_hf as kimi_delta_from_hf
from .hf.latent import latent_from_hf as latent_from_hf
from .hf.lightning import lightning_from_hf as lightning_from_hf
from .source_dicts import all_or_none, bias_or_zeros, drop_zero, matrix, param, read
from .state import load_state as load_state
from .state import save_state as save_state

_QKV = ("W_query", "W_key", "W_value")

# -- SelfAttentionV1 <-> SelfAttentionV2 ------------------------------------------------------


def v1_from_v2(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """SelfAttentionV2 -> SelfAttentionV1: ``W_query = W_query.weight^T`` (the book's transfer).

    Args:
        state: ``W_query.weight``, ``W_key.weight``, ``W_value.weight`` (d_out, d_in), and
            optionally their biases (d_out,), which must then be all zeros: V1 has no bias.

    Returns:
        ``W_query``, ``W_key``, ``W_value`` (d_in, d_out).
    """
    fn = "v1_from_v2"
    weights = [f"{name}.weight" for name in _QKV]
    biases = [f"{name}.bias" for name in _QKV]
    arrays = read(state, fn, weights, biases)
    shape = matrix(arrays, fn, weights[0]).shape
    result = {}
    for name in _QKV:
        weight = param(arrays, fn, f"{name}.weight", shape)
        if f"{name}.bias" in arrays:
            drop_zero(fn, f"{name}.bias", param(arrays, fn, f"{name}.bias", shape[:1]), "V1")
        result[name] = weight.T.copy()  # (d_out, d_in) -> (d_in, d_out)
    return result


def v2_from_v1(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """SelfAttentionV1 -> SelfAttentionV2 without bias (``qkv_bias=False``): a transpose.

    Args:
        state: ``W_query``, ``W_key``, ``W_value`` (d_in, d_out).

    Returns:
        ``W_query.weight``, ``W_key.weight``, ``W_value.weight`` (d_out, d_in).
    """
    fn = "v2_from_v1"
    arrays = read(state, fn, _QKV)
    shape = matrix(arrays, fn, _QKV[0]).shape
    return {
        f"{name}.weight": param(arrays, fn, name, shape).T.copy()  # (d_in, d_out) -> (d_out, d_in)
        for name in _QKV
    }


# -- MultiHeadAttentionWrapper -> MultiHeadAttention ------------------------------------------


def mha_from_wrapper(state: Mapping[str, Any], num_heads: int) -> dict[str, np.ndarray]:
    """MultiHeadAttentionWrapper -> MultiHeadAttention with the same output.

    The wrapper concatenates its heads' outputs, so stacking head h's projections as rows
    h*D:(h+1)*D of W_query/W_key/W_value and setting ``out_proj`` to the identity with zero bias
    gives the same layer. ``out_proj`` is always that identity, also for a gradient dict (the
    wrapper has no such parameter): only the W_* entries of a converted gradient are gradients.

    Args:
        state: ``heads.{h}.W_query.weight`` (D, d_in) for h < num_heads, likewise key and value;
            optional biases ``heads.{h}.W_query.bias`` (D,) (all or none); optional buffers
            ``heads.{h}.mask`` (L, L) (all or none), which must be equal.
        num_heads: H, the number of heads in ``state``.

    Returns:
        ``W_query.weight`` (H*D, d_in) (and biases (H*D,) if the heads have them), likewise key
        and value, ``out_proj.weight`` (H*D, H*D) = identity, ``out_proj.bias`` zeros, and
        ``mask`` when the heads carry it.
    """
    fn = "mha_from_wrapper"
    num_heads = validation.positive_int(f"{fn}: num_heads", num_heads)
    weights = [f"heads.{h}.{name}.weight" for h in range(num_heads) for name in _QKV]
    biases = [f"heads.{h}.{name}.bias" for h in range(num_heads) for name in _QKV]
    masks = [f"heads.{h}.mask" for h in range(num_heads)]
    arrays = read(state, fn, weights, biases + masks)
    has_bias = all_or_none(arrays, fn, biases)
    has_mask = all_or_none(arrays, fn, masks)

    shape = matrix(arrays, fn, weights[0]).shape  # (D, d_in)
    dtype = arrays[weights[0]].dtype
    result = {}
    for name in _QKV:
        heads = [param(arrays, fn, f"heads.{h}.{name}.weight", shape) for h in range(num_heads)]
        result[f"{name}.weight"] = np.concatenate(heads, axis=0)  # H x (D, d_in) -> (H*D, d_in)
        if has_bias:
            heads = [
                param(arrays, fn, f"heads.{h}.{name}.bias", shape[:1]) for h in range(num_heads)
            ]
            result[f"{name}.bias"] = np.concatenate(heads)  # H x (D,) -> (H*D,)
    width = num_heads * shape[0]
    result["out_proj.weight"] = np.eye(width, dtype=dtype)
    result["out_proj.bias"] = np.zeros(width, dtype=dtype)
    if has_mask:
        mask = arrays[masks[0]]
        for name in masks[1:]:
            if arrays[name].shape != mask.shape or not np.array_equal(arrays[name], mask):
                raise ValueError(
                    f"{fn}: {name} differs from {masks[0]}; MultiHeadAttention has one mask"
                )
        result["mask"] = mask.copy()
    return result


# -- MultiHeadAttention (separate) <-> fused --------------------------------------------------


def fused_from_separate(state: Mapping[str, Any], *, cross: bool = False) -> dict[str, np.ndarray]:
    """MultiHeadAttention -> the fused layout, always with biases (missing qkv biases -> zeros).

    Needs d_in == d_out = C. The book's ``mask`` buffer, if present, must be the causal one and is
    dropped: build the fused layer with ``context_size`` = its length. For a gradient dict of a
    layer without qkv bias, the zero ``Wqkv.bias`` is a filler, not a gradient.

    Args:
        state: ``W_query.weight``, ``W_key.weight``, ``W_value.weight`` (C, C), optional biases
            (C,) (all or none), ``out_proj.weight`` (C, C), ``out_proj.bias`` (C,), optional
            ``mask`` (L, L).
        cross: False for the self layout (``Wqkv``), True for CrossAttention's ``Wq`` / ``Wkv``.

    Returns:
        ``Wqkv.weight`` (3C, C) and ``Wqkv.bias`` (3C,), or ``Wq.*`` and ``Wkv.*`` (2C, C) when
        ``cross``; ``Wo.weight`` (C, C), ``Wo.bias`` (C,).
    """
    fn = "fused_from_separate"
    biases = [f"{name}.bias" for name in _QKV]
    required = [f"{name}.weight" for name in _QKV] + ["out_proj.weight", "out_proj.bias"]
    arrays = read(state, fn, required, biases + ["mask"])
    all_or_none(arrays, fn, biases)
    d_out, d_in = matrix(arrays, fn, "W_query.weight").shape
    if d_out != d_in:
        raise ValueError(
            f"{fn}: the fused layers map C -> C, but W_query.weight is (d_out, d_in) = "
            f"{(d_out, d_in)}"
        )
    c, dtype = d_out, arrays["W_query.weight"].dtype
    q, k, v = (param(arrays, fn, f"{name}.weight", (c, c)) for name in _QKV)
    bq, bk, bv = (bias_or_zeros(arrays, fn, f"{name}.bias", c, dtype) for name in _QKV)
    if "mask" in arrays:  # the fused layers have no buffer: only the causal one may be dropped
        masks.check_causal_buffer(f"{fn}: mask", arrays["mask"])

    result = _fused_in_projection(np.concatenate([q, k, v]), np.concatenate([bq, bk, bv]), cross)
    result["Wo.weight"] = param(arrays, fn, "out_proj.weight", (c, c))
    result["Wo.bias"] = param(arrays, fn, "out_proj.bias", (c,))
    return result


def separate_from_fused(
    state: Mapping[str, Any], *, context_length: int | None = None
) -> dict[str, np.ndarray]:
    """The fused layout (self or cross) -> MultiHeadAttention.

    Qkv biases come out only if the source has them (load into ``qkv_bias=True``); ``out_proj``
    always has a bias in the book, so a missing ``Wo.bias`` becomes zeros. A cross layout maps
    too: the book layer on x equals CrossAttention(x, x) with ``causal=True``.

    Args:
        state: ``Wqkv.weight`` (3C, C) or ``Wq.weight`` (C, C) with ``Wkv.weight`` (2C, C);
            ``Wo.weight`` (C, C); optional biases.
        context_length: if given, the book's ``mask`` buffer triu(ones(L, L), 1) is added, in
            the weights' dtype; leave it None for gradient dicts.

    Returns:
        ``W_query.weight`` ... (C, C), optional ``W_query.bias`` ... (C,), ``out_proj.weight``,
        ``out_proj.bias``, and ``mask`` (L, L) when ``context_length`` is given.
    """
    fn = "separate_from_fused"
    if context_length is not None:
        context_length = validation.positive_int(f"{fn}: context_length", context_length)
    arrays, weight, bias = _read_fused_in_projection(state, fn)
    c = weight.shape[1]
    result = {}
    for index, name in enumerate(_QKV):
        result[f"{name}.weight"] = weight[index * c : (index + 1) * c].copy()  # (C, C) block
        if bias is not None:
            result[f"{name}.bias"] = bias[index * c : (index + 1) * c].copy()  # (C,) block
    result["out_proj.weight"] = param(arrays, fn, "Wo.weight", (c, c))
    result["out_proj.bias"] = bias_or_zeros(arrays, fn, "Wo.bias", c, weight.dtype)
    if context_length is not None:
        result["mask"] = masks.causal_buffer(context_length, weight.dtype)
    return result


def _fused_in_projection(
    weight: np.ndarray, bias: np.ndarray | None, cross: bool
) -> dict[str, np.ndarray]:
    """Rows [q; k; v] (3C, C) as ``Wqkv``, or as ``Wq`` (C, C) and ``Wkv`` (2C, C)."""
    if not cross:
        result = {"Wqkv.weight": weight}
        if bias is not None:
            result["Wqkv.bias"] = bias
        return result
    c = weight.shape[1]
    result = {"Wq.weight": weight[:c].copy()}  # (3C, C) -> (C, C)
    if bias is not None:
        result["Wq.bias"] = bias[:c].copy()
    result["Wkv.weight"] = weight[c:].copy()  # (3C, C) -> (2C, C)
    if bias is not None:
        result["Wkv.bias"] = bias[c:].copy()
    return result


def _read_fused_in_projection(
    state: Mapping[str, Any], fn: str
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray | None]:
    """A fused dict (self or cross) and its in-projection as rows [q; k; v] (3C, C), bias (3C,)
    or None. The fused layers tie their biases, but each one is read on its own."""
    if "Wqkv.weight" in state:
        arrays = read(state, fn, ["Wqkv.weight", "Wo.weight"], ["Wqkv.bias", "Wo.bias"])
        weight = matrix(arrays, fn, "Wqkv.weight")
        c = weight.shape[1]
        weight = param(arrays, fn, "Wqkv.weight", (3 * c, c))
        bias = param(arrays, fn, "Wqkv.bias", (3 * c,)) if "Wqkv.bias" in arrays else None
        return arrays, weight, bias
    required = ["Wq.weight", "Wkv.weight", "Wo.weight"]
    if not any(name in state for name in required[:2]):
        raise KeyError(f"{fn}: missing keys: 'Wqkv.weight' (self layout) or {required} (cross)")
    arrays = read(state, fn, required, ["Wq.bias", "Wkv.bias", "Wo.bias"])
    has_bias = all_or_none(arrays, fn, ["Wq.bias", "Wkv.bias"])
    c = matrix(arrays, fn, "Wq.weight").shape[1]
    weight = np.concatenate(
        [param(arrays, fn, "Wq.weight", (c, c)), param(arrays, fn, "Wkv.weight", (2 * c, c))]
    )  # (C, C) and (2C, C) -> (3C, C)
    bias = None
    if has_bias:
        bias = np.concatenate(
            [param(arrays, fn, "Wq.bias", (c,)), param(arrays, fn, "Wkv.bias", (2 * c,))]
        )  # (C,) and (2C,) -> (3C,)
    return arrays, weight, bias


# -- fused <-> torch.nn.MultiheadAttention ----------------------------------------------------


def torch_mha_from_fused(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The fused layout (self or cross) -> ``torch.nn.MultiheadAttention`` (``embed_dim`` = C).

    ``in_proj_weight`` = [Wq; Wk; Wv] is Wqkv, or [Wq; Wkv] for a cross layout (call the torch
    module with query = x, key = value = y). ``nn.MultiheadAttention`` has one ``bias`` flag for
    both projections: if the source has either bias, both come out (a missing one as zeros).

    Args:
        state: ``Wqkv.weight`` (3C, C) or ``Wq.weight`` and ``Wkv.weight``; ``Wo.weight`` (C, C);
            optional biases.

    Returns:
        ``in_proj_weight`` (3C, C), ``out_proj.weight`` (C, C), and ``in_proj_bias`` (3C,),
        ``out_proj.bias`` (C,) when the source has a bias.
    """
    fn = "torch_mha_from_fused"
    arrays, weight, bias = _read_fused_in_projection(state, fn)
    c = weight.shape[1]
    result = {"in_proj_weight": weight}
    has_bias = bias is not None or "Wo.bias" in arrays
    if has_bias:
        result["in_proj_bias"] = bias if bias is not None else np.zeros(3 * c, dtype=weight.dtype)
    result["out_proj.weight"] = param(arrays, fn, "Wo.weight", (c, c))
    if has_bias:
        result["out_proj.bias"] = bias_or_zeros(arrays, fn, "Wo.bias", c, weight.dtype)
    return result


def fused_from_torch_mha(state: Mapping[str, Any], *, cross: bool = False) -> dict[str, np.ndarray]:
    """``torch.nn.MultiheadAttention`` (``kdim = vdim = embed_dim``) -> the fused layout.

    Modules built with ``add_bias_kv=True`` (``bias_k``, ``bias_v``) or with ``kdim``/``vdim`` other
    than ``embed_dim`` (``q_proj_weight`` ...) have no fused equivalent: ``ValueError``.

    Args:
        state: ``in_proj_weight`` (3C, C), ``out_proj.weight`` (C, C), optional ``in_proj_bias``
            (3C,) and ``out_proj.bias`` (C,) (a missing one becomes zeros if the other is there).
        cross: False for ``Wqkv``, True for CrossAttention's ``Wq`` / ``Wkv``.

    Returns:
        ``Wqkv.weight`` (3C, C) (or ``Wq.weight``, ``Wkv.weight``), ``Wo.weight`` (C, C), and
        their biases when the source has a bias.
    """
    fn = "fused_from_torch_mha"
    unsupported = sorted(
        set(state) & {"bias_k", "bias_v", "q_proj_weight", "k_proj_weight", "v_proj_weight"}
    )
    if unsupported:
        raise ValueError(
            f"{fn}: {unsupported} come from add_bias_kv=True or kdim/vdim != embed_dim, which the "
            "fused layers cannot hold"
        )
    arrays = read(
        state, fn, ["in_proj_weight", "out_proj.weight"], ["in_proj_bias", "out_proj.bias"]
    )
    c = matrix(arrays, fn, "in_proj_weight").shape[1]
    weight = param(arrays, fn, "in_proj_weight", (3 * c, c))
    has_bias = "in_proj_bias" in arrays or "out_proj.bias" in arrays
    bias = bias_or_zeros(arrays, fn, "in_proj_bias", 3 * c, weight.dtype) if has_bias else None
    result = _fused_in_projection(weight, bias, cross)
    result["Wo.weight"] = param(arrays, fn, "out_proj.weight", (c, c))
    if has_bias:
        result["Wo.bias"] = bias_or_zeros(arrays, fn, "out_proj.bias", c, weight.dtype)
    return result


# -- fused <-> GPT-2 Conv1D -------------------------------------------------------------------


def gpt2_from_fused(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The fused layout -> GPT-2's attention (``Conv1D`` stores weights (in, out): transposed).

    GPT-2's ``Conv1D`` always has a bias, so missing biases become zeros. A cross layout maps to
    GPT-2's cross-attention: ``q_attn`` for Wq and a (C, 2C) ``c_attn`` for Wkv.

    Args:
        state: ``Wqkv.weight`` (3C, C) or ``Wq.weight`` (C, C) with ``Wkv.weight`` (2C, C);
            ``Wo.weight`` (C, C); optional biases.

    Returns:
        ``c_attn.weight`` (C, 3C), ``c_attn.bias`` (3C,), ``c_proj.weight`` (C, C),
        ``c_proj.bias`` (C,); for a cross layout ``q_attn.weight`` (C, C), ``q_attn.bias`` (C,)
        and ``c_attn.weight`` (C, 2C), ``c_attn.bias`` (2C,).
    """
    fn = "gpt2_from_fused"
    arrays, weight, bias = _read_fused_in_projection(state, fn)
    c = weight.shape[1]
    if bias is None:
        bias = np.zeros(3 * c, dtype=weight.dtype)
    result = {}
    if "Wqkv.weight" in arrays:
        result["c_attn.weight"] = weight.T.copy()  # (3C, C) -> (C, 3C)
        result["c_attn.bias"] = bias
    else:
        result["q_attn.weight"] = weight[:c].T.copy()  # (C, C) -> (C, C) transposed
        result["q_attn.bias"] = bias[:c].copy()
        result["c_attn.weight"] = weight[c:].T.copy()  # (2C, C) -> (C, 2C)
        result["c_attn.bias"] = bias[c:].copy()
    result["c_proj.weight"] = param(arrays, fn, "Wo.weight", (c, c)).T.copy()  # W^T: (in, out)
    result["c_proj.bias"] = bias_or_zeros(arrays, fn, "Wo.bias", c, weight.dtype)
    return result


def fused_from_gpt2(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """GPT-2's attention weights -> the fused layout with biases (self, or cross if ``q_attn``).

    Only the parameters are read; strip the ``h.{i}.attn.`` prefix and leave out GPT-2's
    ``bias`` / ``masked_bias`` buffers (the causal mask, which CausalSelfAttention builds itself).

    Args:
        state: ``c_attn.weight`` (C, 3C), ``c_attn.bias`` (3C,), ``c_proj.weight`` (C, C),
            ``c_proj.bias`` (C,); or, for cross-attention, ``q_attn.weight`` (C, C),
            ``q_attn.bias`` (C,), ``c_attn.weight`` (C, 2C), ``c_attn.bias`` (2C,) and ``c_proj``.

    Returns:
        ``Wqkv.weight`` (3C, C), ``Wqkv.bias``, ``Wo.weight``, ``Wo.bias``; or ``Wq.*``,
        ``Wkv.*``, ``Wo.*`` for cross-attention.
    """
    fn = "fused_from_gpt2"
    cross = "q_attn.weight" in state or "q_attn.bias" in state
    required = ["c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"]
    if cross:
        required = ["q_attn.weight", "q_attn.bias"] + required
    arrays = read(state, fn, required)
    c = matrix(arrays, fn, "c_proj.weight").shape[0]
    result = {}
    if cross:
        result["Wq.weight"] = param(arrays, fn, "q_attn.weight", (c, c)).T.copy()
        result["Wq.bias"] = param(arrays, fn, "q_attn.bias", (c,))
        result["Wkv.weight"] = param(arrays, fn, "c_attn.weight", (c, 2 * c)).T.copy()  # (2C, C)
        result["Wkv.bias"] = param(arrays, fn, "c_attn.bias", (2 * c,))
    else:
        result["Wqkv.weight"] = param(arrays, fn, "c_attn.weight", (c, 3 * c)).T.copy()  # (3C, C)
        result["Wqkv.bias"] = param(arrays, fn, "c_attn.bias", (3 * c,))
    result["Wo.weight"] = param(arrays, fn, "c_proj.weight", (c, c)).T.copy()  # (out, in)
    result["Wo.bias"] = param(arrays, fn, "c_proj.bias", (c,))
    return result
