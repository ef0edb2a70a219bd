"""The model types ``grouped_from_hf`` refuses by name, each with its reason: the twist its
attention has that ``GroupedQueryAttention`` lacks (an output gate, QK-norm after RoPE,
``clip_qkv``, differential or chunked attention, KV sharing...), what the model is instead (a
state-space model, a wrapper whose ``text_config`` to pass), or where it goes (DeepSeek Sparse
Attention: step 19). ``families.model_type`` raises with it. NumPy only.

Tests: tests/numpy_attention/hf/test_refusals_d.py, test_refusals_e.py.
"""

from __future__ import annotations

REFUSED = {
    "gemma3": "the multimodal Gemma 3 config; its language model's attention is 'gemma3_text': "
    "pass config.text_config (and the language model's state dict)",
    "afmoe": "afmoe: an output gate, sigmoid(x W_g) per element (gate_proj), multiplies the "
    "attention's output before o_proj; the layer has no output gate (issue 28)",
    "beam": "beam: an output gate, sigmoid(x W_g + b_h) per element with a bias per head "
    "(gate_proj, gate_bias), multiplies the attention's output before o_proj, and its NoPE layers "
    "multiply the queries by a position-dependent temperature (1 + (p + 1) / 2048) ** 0.1; the "
    "layer has neither (issue 28)",
    "bitnet": "bitnet: an RMSNorm over the concatenated heads (attn_sub_norm) sits between the "
    "attention and o_proj; the layer has no norm there (issue 28)",
    "dbrx": "dbrx: clip_qkv (8 in the released DBRX) clamps the fused Wqkv projection to "
    "[-c, c] before the split, and its heads and RoPE base are read from a nested attn_config; "
    "the layer has no clip and that nesting is not converted (issue 28)",
    "diffllama": "diffllama: differential attention, the difference of two softmax maps "
    "weighted by a learned lambda (lambda_q1, lambda_k1, ...), then a weightless RMSNorm "
    "(groupnorm) over each pair of heads; the layer computes one softmax (issue 28)",
    "doge": "doge: a dynamic mask, computed from the values (dt_proj, A) and kept to the top "
    "keep_window_size keys, is added to the scores; the layer has no such mask (issue 28)",
    "hrm_text": "hrm_text: an output gate, sigmoid(x W_g) per element (gate_proj), multiplies the "
    "attention's output before o_proj, and the model loops its layers over recurrent cycles; "
    "the layer has no output gate (issue 28)",
    "hunyuan_v1_dense": "hunyuan_v1_dense: its QK-norm (query_layernorm, key_layernorm, "
    "RMSNorm per head with a weight) runs after RoPE; the layer's QK-norm runs before RoPE "
    "(issue 28)",
    "hunyuan_v1_moe": "hunyuan_v1_moe: its QK-norm (query_layernorm, key_layernorm, RMSNorm per "
    "head with a weight) runs after RoPE; the layer's QK-norm runs before RoPE (issue 28)",
    "inkling_text": "inkling_text: short convolutions over time on the keys and values "
    "(k_sconv, v_sconv) and learned relative-position logits (r_proj) added to the scores, "
    "instead of RoPE; the layer has neither (issue 28)",
    "inkling2_text": "inkling2_text: an output gate, sigmoid(x W_g) per element (gate_proj), "
    "sinks computed from the input (sink_proj) and L2 clips of q and k; the layer has no output "
    "gate, and its sinks are learned constants (issue 28)",
    "jetmoe": "jetmoe: a mixture of attention heads, each token's queries (and outputs) come "
    "from its top-k routed experts (experts.map, experts.reduce); the layer has one q_proj and "
    "one o_proj (issue 28)",
    "laguna": "laguna: an output gate, softplus(x W_g) per head or per element (g_proj, always "
    "on), multiplies the attention's output before o_proj; the layer has no output gate "
    "(issue 28)",
    "lfm3": "lfm3: an output gate, sigmoid(x W_g) per head (g_proj, under use_attention_gate, on "
    "by default and in the released LFM3), multiplies each head's output before o_proj, and its "
    "full layers rotate with 'proportional' RoPE; the layer has no output gate (issue 28)",
    "llama4": "llama4: the multimodal Llama 4 config; its language model 'llama4_text' is "
    "itself refused: chunked attention, an L2 QK-norm after RoPE and a query temperature on its "
    "NoPE layers (issue 28)",
    "llama4_text": "llama4_text: its RoPE layers attend in chunks (attention_chunk_size) and "
    "L2-normalise q and k after RoPE (use_qk_norm), its NoPE layers scale the queries by a "
    "position-dependent temperature (attn_temperature_tuning); the layer has none of these "
    "(issue 28)",
    "mimo_v2_flash": "mimo_v2_flash: its values are v_head_dim wide (not head_dim) and multiplied "
    "by attention_value_scale, its sliding layers have twice the key/value heads and sinks; the "
    "layer has one head width and no value scale (issue 28)",
    "ministral3": "ministral3: the queries are multiplied by a position-dependent temperature, "
    "1 + llama_4_scaling_beta * log(1 + floor(p / original_max_position_embeddings)), after "
    "RoPE; the layer has no query temperature (issue 28)",
    "nanochat": "nanochat: its QK-norm (a weightless RMSNorm per head) runs after RoPE, and its "
    "rotate_half turns the pairs the other way (x2, -x1); the layer's QK-norm runs before RoPE "
    "and rotates as Llama (issue 28)",
    "mpt": "mpt: ALiBi, a linear bias per head added to the scores, instead of RoPE (and "
    "clip_qkv, qk_ln a LayerNorm with a bias); the layer rotates and has no ALiBi (issue 28)",
    "persimmon": "persimmon: its QK-norm (qk_layernorm, on by default and in Persimmon-8B) is a "
    "LayerNorm with a bias over each head of q and k, and its fused query_key_value interleaves "
    "q, k and v per head; the layer's QK-norm has no bias (issue 28)",
    "gemma3n": "gemma3n: the multimodal Gemma 3n config; its language model 'gemma3n_text' is "
    "itself refused: a weightless RMSNorm on the values and keys and values shared across "
    "layers (issue 28)",
    "gemma3n_text": "gemma3n_text: a weightless RMSNorm on the values (v_norm) before attention, "
    "and its last num_kv_shared_layers layers reuse an earlier layer's keys and values (KV "
    "sharing); the layer has neither (issue 28)",
    **{
        name: f"{name}: a weightless RMSNorm on the values (v_norm) before attention, KV sharing "
        "(its last num_kv_shared_layers layers reuse an earlier layer's keys and values) and, "
        "under attention_k_eq_v, values equal to the keys on the full layers; the layer has no "
        "value norm (issue 28)"
        for name in ("gemma4_text", "gemma4_unified_text")
    },
    **{
        name: f"{name}: the multimodal Gemma 4 config; its language model "
        f"'{text}' is itself refused: a weightless RMSNorm on the values and keys and values "
        "shared across layers (issue 28)"
        for name, text in (("gemma4", "gemma4_text"), ("gemma4_unified", "gemma4_unified_text"))
    },
    **{
        name: f"{name}: a drafter whose every layer reuses the target model's keys and values "
        "(KV sharing, num_kv_shared_layers = num_hidden_layers) under a bidirectional mask; the "
        "layer has no KV sharing (issue 28)"
        for name in ("gemma4_assistant", "gemma4_unified_assistant")
    },
    "deepseek_v4": "deepseek_v4: shared-KV multi-query attention (one kv_proj read as both key "
    "and value), a low-rank query with a weightless RMSNorm, RoPE applied again at position -i "
    "to the output's rotary slice, a grouped low-rank output projection, per-head sinks, and "
    "compressed sparse attention layers (CSA/HCA); neither the grouped nor the latent layer",
    # linear-attention hybrids whose softmax layers carry an output gate
    **{
        name: f"{name}: an output gate: q_proj gives each head 2 * head_dim outputs, the query "
        "and a gate g, and sigmoid(g) multiplies the attention's output per element before "
        "o_proj; the layer has no output gate (issue 28). Its linear_attention layers are gated "
        "DeltaNet (issue 28, step 20)"
        for name in (
            "qwen3_next",
            "qwen3_5_text",
            "qwen3_5_moe_text",
            "qwen4_exp_text",
        )
    },
    **{
        name: f"{name}: the multimodal wrapper; pass config.text_config (its language model "
        f"is {name}_text, refused by name: its softmax layers carry an output gate)"
        for name in ("qwen3_5", "qwen3_5_moe", "qwen4_exp")
    },
    "cohere_compass_text": "cohere_compass_text: multimodal RoPE (mrope_section): each "
    "frequency reads the temporal, height or width position from 3-D position_ids (text, H, W "
    "rows interleaved every third frequency), and a layer whose rope_parameters entry is null "
    "gets none; the layer rotates by one position per token",
    "zaya": "zaya: Compressed Convolutional Attention: q and k come from a causal 1-D "
    "convolution over the sequence (ZayaCCAProjection), v from a delayed recurrent state, then "
    "q and k are L2-normed to sqrt(head_dim) and k scaled by a learned per-kv-head temperature "
    "(ZayaQKNorm); the layer projects each token alone",
    "minimax_m3_vl_text": "minimax_m3_vl_text: its 'minimax_m3_sparse' layers attend only to "
    "the key blocks a Lightning Indexer picks per query (top-k blocks plus local ones, "
    "MiniMaxM3VLIndexer); the layer has no indexer. Its dense layers (Gemma QK-norm, partial "
    "RoPE) are not a row yet",
    "minimax_m3_vl": "minimax_m3_vl: the multimodal wrapper; its language model is "
    "minimax_m3_vl_text, whose sparse layers a Lightning Indexer selects (refused by name)",
    # DeepSeek Sparse Attention: the text configs of latent.py's REFUSED wrappers; their
    # attention is MLA, and its indexed layers a DSA indexer hides keys on
    "glm5_next_text": "glm5_next_text: DeepSeek Sparse Attention: a top-k indexer hides keys "
    "per query, shared across layers; and its attention is multi-head latent attention "
    "(latent_from_hf refuses it for the same reason)",
    "mistral_large4_text": "mistral_large4_text: DeepSeek Sparse Attention: a top-k indexer "
    "hides keys per query, with NoPE layers and KV sharing across layers; and its attention is "
    "multi-head latent attention (latent_from_hf refuses it for the same reason)",
    "dots3_note_text": "dots3_note_text: DeepSeek Sparse Attention on its 'indexed_attention' "
    "layers (a top-k indexer hides keys per query), an output gate sigmoid(g_proj(x)) per head "
    "before o_proj, and a normed rope key; its attention is multi-head latent attention "
    "(latent_from_hf refuses it for the same reason)",
    **{
        name: f"{name}: the multimodal wrapper of {name}_text, whose attention is DeepSeek Sparse "
        "Attention (a top-k indexer hides keys per query) over multi-head latent attention"
        for name in ("glm5_next", "mistral_large4", "dots3_note")
    },
    "gpt_bigcode": "gpt_bigcode: its attention (biased, no RoPE, multi-query by default) is "
    "one fused c_attn whose output splits into q, then one k and v shared by all heads; that "
    "layout is not read here (and scale_attn_weights false scores without 1/sqrt(D))",
    "blt": "blt: the Byte Latent Transformer: a local byte encoder and decoder that "
    "cross-attend to patches, a global transformer over patches and an entropy patcher; no "
    "single decoder stack of self-attention layers to convert",
    "emu3": "emu3: the multimodal wrapper (a VQ-VAE image tokenizer and a text model, "
    "model_type 'emu3_text_model'); its text model is not a row yet",
    "mllama": "mllama: a vision-language model whose text model's cross_attention_layers take "
    "keys and values from the vision encoder's states (MllamaTextCrossAttention, gated by "
    "tanh on the residual); its self-attention layers are not a row yet",
    "modernbert-decoder": "modernbert-decoder: its attention applies attention_dropout a "
    "second time, to Wo's output (out_drop), in training, and its heads are hidden_size // "
    "num_attention_heads wide with no key/value grouping; not a row yet",
    "phi4_multimodal": "phi4_multimodal: the multimodal model (vision and audio encoders "
    "beside a Phi-3 text decoder whose LoRA adapters live outside the base weights); its "
    "attention is not a row yet",
    "recurrent_gemma": "recurrent_gemma: a hybrid of RG-LRU recurrent blocks and local "
    "attention blocks (block_types); its attention (partial RoPE, o_proj always biased) is "
    "not a row yet",
    "falcon_mamba": "falcon_mamba: a state-space model (Mamba with RMS-normed B, C and dt) "
    "with no softmax attention layer",
    "mamba": "mamba: a state-space model with no softmax attention layer",
    "mamba2": "mamba2: a state-space model (Mamba-2, structured state space duality) with no "
    "softmax attention layer",
    "rwkv": "rwkv: an RNN (RWKV time mixing, a decayed weighted key-value recurrence) with no "
    "softmax attention layer",
    "xlstm": "xlstm: a recurrent model (mLSTM matrix-memory blocks) with no softmax attention "
    "layer",
}
