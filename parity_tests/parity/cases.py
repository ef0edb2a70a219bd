"""The one registry of layer parity cases: each layer, with each set of options that changes its
math.

A case is a layer and a set of options that change the math (causal, key padding with a fully padded
batch element, train mode with shared dropout keep-masks, eval mode, cross attention with N != M,
odd lengths, B = H = 1, rank-2 input; for GroupedQueryAttention GQA/MQA/MHA head counts, biases,
QK-norm (before and after RoPE, weightless), a query temperature, sliding windows, softcap, sinks,
a custom scale, RoPE's layouts and attention factor, and left padding with per-batch RoPE
positions; for MultiHeadLatentAttention the query LoRA, biases,
RoPE's layouts, its scales and left padding, each run by both its expanded and its absorbed
computation). pytest and the CLI (``python -m parity_tests``) both iterate over ``CASES``, run
and compared by ``parity_tests.parity.run``.

Tests: tests/parity/test_cases.py.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LayerSpec:
    """How to call a layer: which file, which forward keywords, which mask shapes."""

    module: str  # "attention" (book family), "fused", "grouped" or "latent"
    attn_dropout: str = "none"  # "none", "single" (B, N, N) or "multi" (B, H, N, M)
    out_dropout: bool = False  # output dropout, mask (B, N, C)
    padding: bool = False  # takes a key padding mask (as ``padding_keyword=``)
    cross: bool = False  # forward(x, y, ...)
    parameters: bool = True  # False: nothing to initialise, the NumPy constructor takes no rng
    causal: bool = False  # always causal (the book's mask buffer); CrossAttention takes a keyword
    padding_keyword: str = "mask"  # the forward keyword of the key padding mask
    left_padding: bool = False  # padded cases pad on the left and pass per-batch ``positions``
    # Parameters drawn at random (seeded) after construction: those that start at a constant
    # (RMSNorm's ones, zero sinks) would hide a wrong use of themselves in the forward.
    random_parameters: tuple[str, ...] = ()


LAYERS = {
    "SimpleSelfAttention": LayerSpec("attention", parameters=False),
    "SelfAttentionV1": LayerSpec("attention"),
    "SelfAttentionV2": LayerSpec("attention"),
    "CausalAttention": LayerSpec("attention", attn_dropout="single", causal=True),
    "MultiHeadAttentionWrapper": LayerSpec("attention", attn_dropout="multi", causal=True),
    "MultiHeadAttention": LayerSpec("attention", attn_dropout="multi", causal=True),
    "SingleHeadAttention": LayerSpec("fused"),
    "BidirectionalAttention": LayerSpec("fused", "multi", out_dropout=True, padding=True),
    "CausalSelfAttention": LayerSpec("fused", "multi", out_dropout=True, padding=True, causal=True),
    "CrossAttention": LayerSpec("fused", "multi", out_dropout=True, padding=True, cross=True),
    "GroupedQueryAttention": LayerSpec(
        "grouped",
        "multi",
        padding=True,
        causal=True,
        padding_keyword="key_padding_mask",
        left_padding=True,
        random_parameters=("q_norm.weight", "k_norm.weight", "sinks"),
    ),
    "MultiHeadLatentAttention": LayerSpec(
        "latent",
        "multi",
        padding=True,
        causal=True,
        padding_keyword="key_padding_mask",
        left_padding=True,
        random_parameters=("q_a_layernorm.weight", "kv_a_layernorm.weight", "sinks"),
    ),
}


@dataclass(frozen=True)
class LayerCase:
    """One layer with one set of options.

    Attributes:
        name: unique, readable id, e.g. ``CrossAttention/causal-N37-M113``.
        layer: class name, the same in numpy_attention and torch_attention.
        args: constructor arguments (without ``rng`` / ``backend``).
        width: the input's last axis (d_in or hidden_size).
        heads: number of heads (shapes the dropout masks).
        batch: B, or None for a rank-2 (N, C) input.
        n: query length N.
        m: key/value length M of cross attention (None otherwise).
        padded: pass a key padding mask whose last batch element is fully padded.
        train: train mode with explicit keep-masks shared by both sides.
        kwargs: constructor keywords.
        call: forward keywords that are no arrays, given to both sides as they are (the latent
            layer's ``absorb``).
    """

    name: str
    layer: str
    args: tuple[Any, ...]
    width: int
    heads: int = 1
    batch: int | None = 2
    n: int = 5
    m: int | None = None
    padded: bool = False
    train: bool = False
    kwargs: tuple[tuple[str, Any], ...] = field(default=())
    call: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def spec(self) -> LayerSpec:
        return LAYERS[self.layer]

    @property
    def causal(self) -> bool:
        return self.spec.causal or bool(dict(self.kwargs).get("causal", False))

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    def applies_to(self, backend: str) -> bool:
        """Whether ``backend`` computes this case: SDPA refuses an explicit dropout keep-mask
        (train cases with dropout), softcap and sinks (torch_attention.backends says why), so
        those cases do not run on it; the layer refuses the call rather than compute it."""
        has_dropout = self.spec.attn_dropout != "none" or self.spec.out_dropout
        options = dict(self.kwargs)
        refused = (self.train and has_dropout) or options.get("softcap") or options.get("sinks")
        return not (backend == "sdpa" and refused)


def _book_cases() -> list[LayerCase]:
    cases = []
    for layer in ("SimpleSelfAttention", "SelfAttentionV1", "SelfAttentionV2"):
        args = () if layer == "SimpleSelfAttention" else (3, 4)
        width = 4 if layer == "SimpleSelfAttention" else 3
        cases += [
            LayerCase(f"{layer}/B2-N5", layer, args, width),
            LayerCase(f"{layer}/rank2-N7", layer, args, width, batch=None, n=7),
            LayerCase(f"{layer}/B1-N37", layer, args, width, batch=1, n=37),
        ]
    cases.append(
        LayerCase(
            "SelfAttentionV2/qkv_bias",
            "SelfAttentionV2",
            (3, 4, True),
            3,
            n=6,
        )
    )
    for layer, heads in (
        ("CausalAttention", 1),
        ("MultiHeadAttentionWrapper", 2),
        ("MultiHeadAttention", 2),
    ):
        extra = (heads,) if heads > 1 else ()
        for bias in (False, True):
            tag = "-qkv_bias" if bias else ""
            cases += [
                LayerCase(f"{layer}/eval-N5{tag}", layer, (3, 4, 8, 0.0, *extra, bias), 3, heads),
                LayerCase(
                    f"{layer}/train-dropout-N7{tag}",
                    layer,
                    (3, 4, 8, 0.25, *extra, bias),
                    3,
                    heads,
                    n=7,
                    train=True,
                ),
            ]
        cases.append(
            LayerCase(f"{layer}/B1-N37", layer, (5, 6, 40, 0.1, *extra), 5, heads, batch=1, n=37)
        )
    cases.append(
        LayerCase(
            "MultiHeadAttention/one-head-B1", "MultiHeadAttention", (3, 4, 8, 0.0, 1), 3, 1, batch=1
        )
    )
    return cases


def _fused_cases() -> list[LayerCase]:
    cases = [
        LayerCase("SingleHeadAttention/B2-N5", "SingleHeadAttention", (8,), 8),
        LayerCase(
            "SingleHeadAttention/no-bias-B1-N37",
            "SingleHeadAttention",
            (12, False),
            12,
            batch=1,
            n=37,
        ),
    ]
    for layer in ("BidirectionalAttention", "CausalSelfAttention"):
        ctx = (64,) if layer == "CausalSelfAttention" else ()
        cases += [
            LayerCase(f"{layer}/eval-N5", layer, (8, 2, *ctx), 8, 2),
            LayerCase(f"{layer}/padded-N7", layer, (8, 2, *ctx), 8, 2, n=7, padded=True),
            LayerCase(
                f"{layer}/train-dropout-padded-N7",
                layer,
                (8, 2, *ctx, 0.2, 0.3),
                8,
                2,
                n=7,
                padded=True,
                train=True,
            ),
            LayerCase(f"{layer}/one-head-B1-N37", layer, (6, 1, *ctx), 6, 1, batch=1, n=37),
            LayerCase(f"{layer}/no-bias-N5", layer, (8, 4, *ctx), 8, 4, kwargs=(("bias", False),)),
        ]
    for causal in (False, True):
        tag = "causal-" if causal else ""
        kwargs = (("causal", causal),)
        cases += [
            LayerCase(
                f"CrossAttention/{tag}N5-M7", "CrossAttention", (8, 2), 8, 2, m=7, kwargs=kwargs
            ),
            LayerCase(
                f"CrossAttention/{tag}N7-M5-padded",
                "CrossAttention",
                (8, 2),
                8,
                2,
                n=7,
                m=5,
                padded=True,
                kwargs=kwargs,
            ),
            LayerCase(
                f"CrossAttention/{tag}train-dropout-N5-M7",
                "CrossAttention",
                (8, 2, 0.2, 0.3),
                8,
                2,
                m=7,
                padded=True,
                train=True,
                kwargs=kwargs,
            ),
            LayerCase(
                f"CrossAttention/{tag}B1-one-head-N37-M113",
                "CrossAttention",
                (4, 1),
                4,
                1,
                batch=1,
                n=37,
                m=113,
                kwargs=kwargs,
            ),
        ]
    return cases


def _grouped_cases() -> list[LayerCase]:
    """Today's decoder attention: head counts (GQA, MQA, MHA), then each option of the layer
    alone at GQA, then the combinations Qwen3, Gemma 2 and GPT-OSS use."""
    layer = "GroupedQueryAttention"

    def case(name: str, heads: int, kv_heads: int, **kwargs: Any) -> LayerCase:
        options = {"head_dim": 6} | kwargs.pop("options", {})
        return LayerCase(
            f"{layer}/{name}",
            layer,
            (16, heads, kv_heads),
            16,
            heads,
            kwargs=tuple(options.items()),
            **kwargs,
        )

    return [
        case("eval-N5", 4, 2),
        case("mqa-B1-N37", 4, 1, batch=1, n=37),
        case("mha-N7", 2, 2, n=7, options={"head_dim": None}),
        case("one-head-B1-N5", 1, 1, batch=1),
        case("padded-N7", 4, 2, n=7, padded=True),
        case("bias-N5", 4, 2, options={"bias": True, "out_bias": True}),
        case("qk_norm-N7", 4, 2, n=7, options={"qk_norm": True, "norm_eps": 1e-5}),
        case("window-N37", 4, 2, n=37, options={"window": (7, 0)}),
        case("softcap-N7", 4, 2, n=7, options={"softcap": 1.5}),
        case("sinks-N7", 4, 2, n=7, options={"sinks": True}),
        case("scaling-N5", 4, 2, options={"scaling": 0.3}),
        case(
            "rope-interleaved-factor-N7",
            4,
            2,
            n=7,
            options={"rope_interleaved": True, "rope_attention_factor": 1.3, "rope_theta": 500.0},
        ),
        case(
            "train-dropout-padded-N7",
            4,
            2,
            n=7,
            padded=True,
            train=True,
            options={"dropout": 0.25},
        ),
        case(
            "qwen3-like-padded-N7",
            4,
            2,
            n=7,
            padded=True,
            options={"qk_norm": True, "window": (3, 0)},
        ),
        case(
            "gemma2-like-N37",
            4,
            2,
            n=37,
            options={"softcap": 2.0, "scaling": 0.25, "window": (5, 0)},
        ),
        case(
            "gpt-oss-like-padded-N37",
            4,
            2,
            n=37,
            padded=True,
            options={"sinks": True, "bias": True, "out_bias": True, "window": (6, 0)},
        ),
        case(
            "hunyuan-like-qk-norm-after-rope-padded-N7",
            4,
            2,
            n=7,
            padded=True,
            options={"qk_norm": True, "qk_norm_position": "after_rope", "norm_eps": 1e-5},
        ),
        case(
            "nanochat-like-weightless-after-rope-N7",
            4,
            4,
            n=7,
            options={
                "qk_norm": True,
                "qk_norm_type": "rms_weightless",
                "qk_norm_position": "after_rope",
                "inv_freq": [-1.0, -0.1, -0.01],  # turned by -angle
            },
        ),
        case(  # 1 + 0.1 log(1 + floor(p / 8)): five steps over 37 positions
            "ministral3-like-temperature-padded-N37",
            4,
            2,
            n=37,
            padded=True,
            options={
                "query_temperature": {"kind": "log_floor", "beta": 0.1, "length": 8, "offset": 0},
                "window": (6, 0),
            },
        ),
        case(  # differential attention: two value pairs (4 kv heads), values 2D wide
            "diffllama-like-differential-padded-N7",
            8,
            4,
            n=7,
            padded=True,
            options={"differential": True, "lambda_init": 0.3, "bias": True},
        ),
        case(  # Gemma 3n's source layers: a weightless RMSNorm on v, QK-norm, scores unscaled
            "gemma3n-like-value-norm-padded-N37",
            4,
            2,
            n=37,
            padded=True,
            options={"value_norm": True, "qk_norm": True, "scaling": 1.0, "window": (5, 0)},
        ),
    ]


def _latent_cases() -> list[LayerCase]:
    """Multi-head latent attention: each set of options run expanded and absorbed (the forward's
    ``absorb``), the two computations of the same numbers."""
    layer = "MultiHeadLatentAttention"
    sizes = {"kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 5}
    options: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("eval-N5", {}, {}),
        ("q_lora-bias-padded-N7", {"q_lora_rank": 5, "bias": True}, {"n": 7, "padded": True}),
        ("train-dropout-padded-N7", {"dropout": 0.25}, {"n": 7, "padded": True, "train": True}),
        (
            "scales-rotate_half-B1-N37",
            {
                "rope_interleave": False,
                "rope_attention_factor": 1.2,
                "scaling": 0.3,
                "latent_scale": 1.5,
                "query_temperature": (0.2, 8),
            },
            {"n": 37, "batch": 1},
        ),
        ("gate_head-padded-N7", {"output_gate": "head"}, {"n": 7, "padded": True}),  # Bailing
        (
            "gate_element-softplus-bias-N5",
            {"output_gate": "element", "gate_activation": "softplus", "gate_bias": True},
            {},
        ),
        (  # DeepSeek-V3.2's DSA: 2 indexer heads keep 4 of up to 9 keys per query
            "dsa-padded-N9",
            {"q_lora_rank": 5, "index_n_heads": 2, "index_head_dim": 6, "index_topk": 4},
            {"n": 9, "padded": True},
        ),
        (  # HY-V4's: sinks, a gate per element, the indexer's RoPE on its heads' last R dims
            "dsa_hy-sinks-gate-padded-N9",
            {
                "q_lora_rank": 5,
                "index_n_heads": 4,
                "index_head_dim": 6,
                "index_topk": 4,
                "index_rope_position": "last",
                "sinks": True,
                "output_gate": "element",
                "rope_interleave": False,
            },
            {"n": 9, "padded": True},
        ),
        (  # AXK2's: the queries and a gate per element from one projection of [q_resid, q_a]
            "dsa_axk2-query_gate-padded-N9",
            {
                "q_lora_rank": 5,
                "index_n_heads": 4,
                "index_head_dim": 6,
                "index_topk": 4,
                "query_gate": True,
                "bias": True,
            },
            {"n": 9, "padded": True},
        ),
    ]
    return [
        LayerCase(
            f"{layer}/{form}-{name}",
            layer,
            (16, 3),
            16,
            3,
            kwargs=tuple((sizes | extra).items()),
            call=(("absorb", form == "absorbed"),),
            **case,
        )
        for name, extra, case in options
        for form in ("expanded", "absorbed")
    ]


CASES: tuple[LayerCase, ...] = tuple(
    _book_cases() + _fused_cases() + _grouped_cases() + _latent_cases()
)

# The smaller set behind ``--quick``: every layer once in eval mode and once in train mode.
QUICK_CASES: tuple[LayerCase, ...] = tuple(
    case
    for case in CASES
    if case.name.split("/")[1]
    in {"B2-N5", "eval-N5", "train-dropout-N7", "train-dropout-padded-N7", "N5-M7"}
    or case.name
    in {
        "CrossAttention/causal-train-dropout-N5-M7",
        "MultiHeadLatentAttention/absorbed-eval-N5",
        "MultiHeadLatentAttention/absorbed-train-dropout-padded-N7",
    }
)
