"""The specs: one module per kernel API, each a ``Spec`` plugin (``checker.spec``) named ``SPEC``
in its module, found here by walking this package: a module whose name starts with "_" holds
what several specs share (``_attention``: kernels over whole sequences; ``_decode``: kernels
over a cache; ``_sparse``: kernels by indices; ``_linear``: linear attention as a recurrence;
``_serving``: serving engines' paged calls; ``_widths``: the battery hooks of the last three)
and is no spec. Adding a kernel API adds its module here, its broken kernels under
``checker.pitfalls`` and its tests; nothing else changes (docs/checker-map.md).

- "sdpa": ``F.scaled_dot_product_attention``'s signature, (B, H, N, D), causal top-left.
- "flash", "flash_varlen": flash-attn's ``flash_attn_func`` and ``flash_attn_varlen_func``.
- "flex": FlexAttention's ``flex_attention``, the checker building its mods and block masks.
- "ring": ``torch_attention.distributed.ring_attention`` on spawned gloo ranks.
- "flash_kvcache", "flash_mla": flash-attn's ``flash_attn_with_kvcache`` and FlashMLA's
  ``flash_mla_with_kvcache``, decode kernels over a cache.
- "sparse", "flash_mla_sparse": attention by indices (DeepSeek-V3.2's DSA): the torch twin's
  differentiable ``sparse_attention`` and FlashMLA's ``flash_mla_sparse_fwd``.
- "fla_gdn", "fla_kda": flash-linear-attention's ``chunk_gated_delta_rule`` (gated DeltaNet) and
  ``chunk_kda`` (Kimi Delta Attention, a gate per key channel), linear attention as a
  recurrence, judged on o, the final state and every gradient.
- "flashinfer_paged", "flashinfer_merge", "vllm_paged": FlashInfer's paged prefill/decode
  wrappers (plan/run over CSR page tables, base-2 lse) and its cascade merge, and vLLM's paged
  backend (the new tokens written at ``slot_mapping``, then mixed prefill/decode batches).

``SPECS`` names them in that order, ``FEATURES`` every feature any of them can express (a
spec's ``opt_in`` features too; ``SPEC_FEATURES``: each spec's default claim); ``get``
returns one by name (a ValueError listing them for another name).

Tests: tests/checker/test_spec.py, tests/checker/specs/
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from functools import cache

from ..spec import Spec

# The order specs are listed in (help, docs, reports); a spec not named here comes after them.
_ORDER = (
    "sdpa", "flash", "flash_varlen", "flex", "ring", "flash_kvcache", "flash_mla", "sparse",
    "flash_mla_sparse", "fla_gdn", "fla_kda", "flashinfer_paged", "flashinfer_merge", "vllm_paged",
)  # fmt: skip


@cache
def registry() -> dict[str, Spec]:
    """Every spec of this package by name."""
    found: dict[str, Spec] = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("_"):
            continue
        spec = importlib.import_module(f"{__name__}.{module.name}").SPEC
        if spec.name != module.name:
            raise RuntimeError(f"specs.{module.name} defines the spec {spec.name!r}")
        found[spec.name] = spec
    ordered = sorted(found, key=lambda name: (_ORDER.index(name) if name in _ORDER else 99, name))
    return {name: found[name] for name in ordered}


def get(spec: object) -> Spec:
    """The spec called ``spec`` (a ``Spec`` is returned as it is)."""
    if isinstance(spec, Spec):
        return spec
    specs = registry()
    if not isinstance(spec, str) or spec not in specs:
        raise ValueError(f"spec must be one of {list(specs)}, got {spec!r}")
    return specs[spec]


def check_spec(spec: object) -> str:
    """``spec`` if it names a spec, else a ValueError listing them."""
    return get(spec).name


def resolve_features(spec: object, features: Iterable[str] | str | None) -> frozenset[str]:
    """The features a kernel of ``spec`` claims: the spec's set for None (its ``opt_in``
    features left out), else the names given (an unknown name, or one the spec cannot express,
    is a ValueError)."""
    found = get(spec)
    if features is None:
        return found.features
    if isinstance(features, str):
        raise TypeError(f"features must be a collection of names, got the string {features!r}")
    names = frozenset(features)
    known = _features()
    unknown = sorted(str(name) for name in names if name not in known)
    if unknown:
        raise ValueError(f"unknown features {unknown}; known: {list(known)}")
    foreign = sorted(names - found.features - found.opt_in)
    if foreign:
        raise ValueError(
            f"spec {found.name!r} cannot express the features {foreign}; "
            f"its features: {sorted(found.features | found.opt_in)}"
        )
    return names


def __getattr__(name: str) -> object:
    """``SPECS`` (the names), ``FEATURES`` (every feature, in the specs' order) and
    ``SPEC_FEATURES`` (each spec's features), computed from the registry."""
    if name == "SPECS":
        return tuple(registry())
    if name == "SPEC_FEATURES":
        return {spec.name: spec.features for spec in registry().values()}
    if name == "FEATURES":
        return _features()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _features() -> tuple[str, ...]:
    # The order the features were always listed in, then those of later specs.
    first = (
        "mask",
        "causal",
        "dropout",
        "gqa",
        "window",
        "softcap",
        "alibi",
        "lse",
        "dv",
        "rotary",
        "paged",
        "append",
        "leftpad",
        "batch_idx",
        "splits",
    )
    every = {f for spec in registry().values() for f in spec.features | spec.opt_in}
    rest = sorted(every - set(first))
    return first + tuple(rest)
