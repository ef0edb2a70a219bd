"""Every signature docs/design.md writes, ``name(parameters)`` in its code (inline code, fenced
blocks, and the constructor column of its layer tables), agrees with the code's
``inspect.signature``: the same parameters in the same order, of the same kind (positional or
keyword-only), with the same defaults, and the same result where it names one. The contract
cannot drift from the code unnoticed.

Nothing is skipped in silence. Code whose parentheses hold a parameter list (``exp(floor)``
does, ``max(1e-5, ...)`` does not) is a signature: ``KNOWN`` resolves it to the code it
describes, or ``LEFT_OUT`` says why it is not this project's signature (a formula, a library's
function, an example call); one that is in neither fails the test, and so does an entry of
either table that design.md no longer writes. A parameter the code has and a signature leaves out
is allowed only where design.md says so in prose (``EXTRAS``, each with the sentence it is
stated in).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"

NA, TA = "numpy_attention", "torch_attention"


def _both(module: str, name: str) -> tuple[str, ...]:
    return (f"{NA}.{module}.{name}", f"{TA}.{module}.{name}")


# What each written name means: the code it describes, every one of them (a layer in both
# packages is checked in both). A layer table's constructor is keyed by its class name, its
# forward by "Class.forward".
KNOWN: dict[str, tuple[str, ...]] = {
    # result types
    "AttentionOutput": (f"{NA}.scores.AttentionOutput",),
    "AttentionGrads": (f"{NA}.scores.AttentionGrads",),
    "MergeOutput": (f"{NA}.merge.MergeOutput",),
    "MergeGrads": (f"{NA}.merge.MergeGrads",),
    "torch_attention.functional.AttentionOutput": (f"{TA}.functional.AttentionOutput",),
    # the functional core, merge, varlen, RoPE
    "attention_forward": (f"{NA}.functional.attention_forward",),
    "attention_backward": (f"{NA}.functional.attention_backward",),
    "merge_attention_forward": (f"{NA}.merge.merge_attention_forward",),
    "merge_attention_backward": (f"{NA}.merge.merge_attention_backward",),
    "varlen_attention_forward": (f"{NA}.varlen.varlen_attention_forward",),
    "rope_forward": (f"{NA}.rope.rope_forward",),
    # sparse attention by indices and the lightning indexer
    "sparse_attention_forward": (f"{NA}.sparse.sparse_attention_forward",),
    "sparse_attention_backward": (f"{NA}.sparse.sparse_attention_backward",),
    "SparseGrads": (f"{NA}.sparse.SparseGrads",),
    "LinearOutput": (f"{NA}.linear_attention.LinearOutput",),
    "LinearGrads": (f"{NA}.linear_attention.LinearGrads",),
    "torch_attention.sparse_attention": (f"{TA}.sparse.sparse_attention",),
    "indexer_forward": (f"{NA}.indexer.indexer_forward", f"{TA}.indexer.indexer_scores"),
    "IndexerOutput": (f"{NA}.indexer.IndexerOutput",),
    "indexer_backward": (f"{NA}.indexer.indexer_backward",),
    "topk_indices": (f"{NA}.indexer.topk_indices", f"{TA}.indexer.topk_indices"),
    "indexer_kl_loss": (f"{NA}.indexer.indexer_kl_loss", f"{TA}.indexer.indexer_kl_loss"),
    "KLOutput": (f"{NA}.indexer.KLOutput",),
    "cache.index_append": (
        f"{NA}.latent_cache.LatentCache.index_append",
        f"{NA}.latent_cache.PagedLatentCache.index_append",
        f"{TA}.latent_cache.LatentCache.index_append",
        f"{TA}.latent_cache.PagedLatentCache.index_append",
    ),
    "torch_attention.functional.attention": (f"{TA}.functional.attention",),
    "torch_attention.distributed.ring_attention": (f"{TA}.distributed.ring_attention",),
    # the NumPy module base and tools
    "backward": (f"{NA}.module.Module.backward",),
    "state_dict": (f"{NA}.module.Module.state_dict",),
    "load_state_dict": (f"{NA}.module.Module.load_state_dict",),
    "zero_grad": (f"{NA}.module.Module.zero_grad",),
    "named_parameters": (f"{NA}.module.Module.named_parameters",),
    "named_grads": (f"{NA}.module.Module.named_grads",),
    "train": (f"{NA}.module.Module.train",),
    "eval": (f"{NA}.module.Module.eval",),
    "no_grad": (f"{NA}.no_grad",),
    "numpy_attention.no_grad": (f"{NA}.no_grad",),
    "gradcheck": (f"{NA}.gradcheck.gradcheck",),
    "torch_attention.to_numpy": (f"{TA}.to_numpy",),
    "from_numpy": (f"{TA}.from_numpy",),
    "mha_from_wrapper": (f"{NA}.convert.mha_from_wrapper",),
    "save_state": (f"{NA}.state.save_state",),
    "load_state": (f"{NA}.state.load_state",),
    "numpy_attention.convert.grouped_from_hf": (f"{NA}.convert.grouped_from_hf",),
    "hf_attention_state_from_grouped": (f"{NA}.hf.grouped.hf_attention_state_from_grouped",),
    # the layers
    **{name: _both("attention", name) for name in (
        "SimpleSelfAttention", "SelfAttentionV1", "SelfAttentionV2", "CausalAttention",
        "MultiHeadAttentionWrapper", "MultiHeadAttention",
    )},
    **{name: _both("fused", name) for name in (
        "SingleHeadAttention", "BidirectionalAttention", "CausalSelfAttention", "CrossAttention",
    )},
    "BidirectionalAttention.forward": _both("fused", "BidirectionalAttention.forward"),
    "CrossAttention.forward": _both("fused", "CrossAttention.forward"),
    "GroupedQueryAttention": _both("grouped", "GroupedQueryAttention"),
    "forward": _both("grouped", "GroupedQueryAttention.forward"),  # the one bare forward(...)
    "KVCache": _both("decode.cache", "KVCache"),
    "RMSNorm": _both("norms", "RMSNorm"),
    "SharedKV": _both("shared_kv", "SharedKV"),
    "LayerNorm": _both("norms", "LayerNorm"),
    "MultiHeadLatentAttention": _both("latent", "MultiHeadLatentAttention"),
    "MultiHeadLatentAttention.forward": _both("latent", "MultiHeadLatentAttention.forward"),
    "MultiHeadLatentAttention.absorbs": _both("latent", "MultiHeadLatentAttention.absorbs"),
    "LatentCache": _both("latent_cache", "LatentCache"),
    "kvcache_attention_forward": (f"{NA}.decode.paged.kvcache_attention_forward",),
    "PagedKVCache": _both("decode.cache", "PagedKVCache"),
    "attend": (f"{NA}.decode.cache.KVCache.attend", f"{NA}.decode.cache.PagedKVCache.attend"),
    "numpy_attention.convert.latent_from_hf": (f"{NA}.convert.latent_from_hf",),
    "append": _both("decode.cache", "KVCache.append"),
    "differential.lambda_init_from_depth": (f"{NA}.differential.lambda_init_from_depth",),
    # the kernel checker
    "check_kernel": ("parity_tests.checker.pipeline.check_kernel",),
    "KernelLimits": ("parity_tests.checker.battery.limits.KernelLimits",),
}  # fmt: skip

# Written like signatures, and deliberately not compared, with the reason.
LEFT_OUT: dict[str, str] = {
    "kernel": "the sdpa spec's call of a user's kernel; torch's F.scaled_dot_product_attention, "
    "which it mirrors, is a builtin without an introspectable signature",
    "flash_attn_func": "flash-attn's function, a library this project does not install",
    "flash_attn_varlen_func": "flash-attn's function, a library this project does not install",
    "flash_attn_with_kvcache": "flash-attn's function, a library this project does not install",
    "flash_mla_with_kvcache": "FlashMLA's function, a library this project does not install",
    "flex_attention": "the flex spec's call of FlexAttention: the arguments the checker passes, "
    "not torch's full signature (torch 2.13 adds kernel_options and return_aux)",
    "numpy_module.load_state_dict": "an example call (load_state_dict's signature is written too)",
    "kv_a_proj_with_mqa": "a projection of the latent layer applied in a formula",
    "kv_b_proj": "a projection of the latent layer applied in a formula",
    "config.to_dict": "a method of Hugging Face's config classes",
    "x_backward": "a pattern: x stands for any pure function with a backward",
    "exp": "a formula",
    "floor": "a formula (the floor of a dtype)",
    "sqrt": "a formula",
    "arange": "a formula",
}

# Parameters the code has that a written signature leaves out, where design.md states them in
# prose: (the code, the parameter) -> the sentence that says so (whitespace-normalised).
_NUMPY_RNG = "NumPy constructors take an extra keyword `rng=`"
_TORCH_BACKEND = "Their constructors also take a keyword `backend=`"
_FUSED_DROPOUT = (
    "Every fused forward also takes the keywords `attn_dropout_mask=None, out_dropout_mask=None`"
)
EXTRAS: dict[tuple[str, str], str] = {
    **{(f"{NA}.attention.{name}", "rng"): _NUMPY_RNG for name in (
        "SelfAttentionV1", "SelfAttentionV2", "CausalAttention", "MultiHeadAttentionWrapper",
        "MultiHeadAttention",
    )},
    **{(f"{NA}.fused.{name}", "rng"): _NUMPY_RNG for name in (
        "SingleHeadAttention", "BidirectionalAttention", "CausalSelfAttention", "CrossAttention",
    )},
    **{(f"{TA}.attention.{name}", "backend"): _TORCH_BACKEND for name in (
        "SimpleSelfAttention", "SelfAttentionV1", "SelfAttentionV2", "CausalAttention",
        "MultiHeadAttentionWrapper", "MultiHeadAttention",
    )},
    **{(f"{TA}.fused.{name}", "backend"): _TORCH_BACKEND for name in (
        "SingleHeadAttention", "BidirectionalAttention", "CausalSelfAttention", "CrossAttention",
    )},
    **{(f"{TA}.grouped.GroupedQueryAttention", name): text for name, text in (
        ("backend", _TORCH_BACKEND),
    )},
    (f"{NA}.grouped.GroupedQueryAttention", "rng"): _NUMPY_RNG,
    **{(f"{pkg}.fused.{layer}.forward", name): _FUSED_DROPOUT
       for pkg in (NA, TA) for layer in ("BidirectionalAttention", "CrossAttention")
       for name in ("attn_dropout_mask", "out_dropout_mask")},
    (f"{TA}.decode.cache.KVCache", "device"): "(the torch one also takes `device=`)",
    (f"{TA}.latent_cache.LatentCache", "device"): "(the torch one also takes `device=`)",
    (f"{TA}.decode.cache.PagedKVCache", "device"): "(the torch one also takes `device=`)",
    (f"{NA}.latent.MultiHeadLatentAttention", "rng"): "(`rng=` in NumPy, `backend=` in torch.)",
    (f"{TA}.latent.MultiHeadLatentAttention", "backend"): "(`rng=` in NumPy, `backend=` in torch.)",
}  # fmt: skip


@dataclass(frozen=True)
class Written:
    """A signature as design.md writes it."""

    key: str  # the name as written; in a layer table "Class" or "Class.forward"
    params: str  # between the parentheses
    returns: str  # after "->", or ""
    line: int

    def __str__(self) -> str:
        arrow = f" -> {self.returns}" if self.returns else ""
        return f"design.md:{self.line}: {self.key}({' '.join(self.params.split())}){arrow}"


_CALL = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\(")
_RETURNS = re.compile(r"\s*->\s*(\([^()]*\)|[A-Za-z_][\w.]*)")
_SPAN = re.compile(r"`([^`]+)`")


def _calls(code: str, start_line: int, owner: str | None) -> list[Written]:
    """Every ``name(...)`` in ``code`` (balanced parentheses, across lines) that holds a
    parameter list."""
    found = []
    for match in _CALL.finditer(code):
        depth, end = 0, None
        for index in range(match.end() - 1, len(code)):
            depth += {"(": 1, ")": -1}.get(code[index], 0)
            if depth == 0:
                end = index
                break
        if end is None:
            continue
        name, params = match.group(1), code[match.end() : end]
        if owner is not None and name == "forward":
            name = f"{owner}.forward"
        returns = _RETURNS.match(code, end + 1)
        line = start_line + code.count("\n", 0, match.start())
        written = Written(name, params, returns.group(1) if returns else "", line)
        if _parameters(written) is not None or name in KNOWN:
            found.append(written)
    return found


def written_signatures(text: str) -> list[Written]:
    """The signatures of a Markdown text: in fenced blocks, in inline code, and in layer tables
    (a code cell "(...)" in the "constructor" column is its row's class's constructor)."""
    lines = text.splitlines()
    found: list[Written] = []
    prose = []  # the lines outside fences and layer tables, blank where those are
    fence: list[str] | None = None
    constructor_column = None
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("```"):
            if fence is None:
                fence = []
                fence_start = number + 1
            else:
                found += _calls("\n".join(fence), fence_start, None)
                fence = None
            prose.append("")
            continue
        if fence is not None:
            fence.append(line)
            prose.append("")
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and "constructor" in cells:
            constructor_column = cells.index("constructor")
        elif not line.startswith("|"):
            constructor_column = None
        if line.startswith("|") and constructor_column is not None and len(cells) > 1:
            owner = cells[0]
            for column, cell in enumerate(cells):
                for span in _SPAN.findall(cell):
                    if column == constructor_column and span.startswith("("):
                        found.append(Written(owner, span[1:-1], "", number))
                    else:
                        found += _calls(span, number, owner)
            prose.append("")
            continue
        prose.append(re.sub(r"^>\s?", "", line))  # a blockquote's text without its marks
    text = "\n".join(prose)
    for match in _SPAN.finditer(text):
        found += _calls(match.group(1), text.count("\n", 0, match.start(1)) + 1, None)
    return found


def _parameters(written: Written) -> list[inspect.Parameter] | None:
    """The written parameters as ``inspect.Parameter``s (defaults evaluated; ``...`` stands for
    a default not spelled out), or None when the text is no parameter list."""
    try:
        tree = ast.parse(f"def _({written.params}): pass")
    except SyntaxError:
        return None
    args = tree.body[0].args
    kinds = inspect.Parameter
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = []
    try:
        for arg, default in zip(positional, defaults, strict=True):
            kind = kinds.POSITIONAL_ONLY if arg in args.posonlyargs else kinds.POSITIONAL_OR_KEYWORD
            params.append(_parameter(arg.arg, kind, default))
        if args.vararg:
            params.append(kinds(args.vararg.arg, kinds.VAR_POSITIONAL))
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            params.append(_parameter(arg.arg, kinds.KEYWORD_ONLY, default))
        if args.kwarg:
            params.append(kinds(args.kwarg.arg, kinds.VAR_KEYWORD))
    except ValueError:  # a default that is not a literal: an expression, not a signature
        return None
    return params


def _parameter(name: str, kind: Any, default: ast.expr | None) -> inspect.Parameter:
    value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
    return inspect.Parameter(name, kind, default=value)


def _resolve(path: str) -> Any:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(path)


def code_signature(path: str) -> inspect.Signature:
    """The signature a caller sees: a function's; a class's constructor (a NamedTuple: its
    fields); a method's without ``self``."""
    target = _resolve(path)
    if inspect.isclass(target) and not issubclass(target, tuple):
        signature = inspect.signature(target.__init__)
    else:
        signature = inspect.signature(target)
    params = list(signature.parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return signature.replace(parameters=params)


def _normalised(text: str) -> str:
    return " ".join(text.split())


def mismatches(written: Written, path: str, design_text: str) -> list[str]:
    """How the written signature differs from the code at ``path`` (empty: it agrees)."""
    signature = code_signature(path)
    problems = []
    code = list(signature.parameters.values())
    for param in list(code):
        stated = EXTRAS.get((path, param.name))
        if stated is not None and param.name not in written.params:
            if _normalised(stated) not in _normalised(design_text):
                problems.append(f"{param.name}: EXTRAS cites {stated!r}, not in design.md")
            code.remove(param)
    doc = _parameters(written)
    if doc is None:
        return [f"the parameters {written.params!r} do not parse"]
    unspelled = {p.name for p in doc if p.default is Ellipsis}  # "dtypes=(...)"
    code = [
        p.replace(default=Ellipsis)
        if p.name in unspelled and p.default is not inspect.Parameter.empty
        else p
        for p in code
    ]
    doc_text = [_describe(p) for p in doc]
    code_text = [_describe(p) for p in code]
    if doc_text != code_text:
        problems.append(f"design.md has ({', '.join(doc_text)}), the code ({', '.join(code_text)})")
    problems += _returns(written, signature, path)
    return problems


def _describe(param: inspect.Parameter) -> str:
    """A parameter as a signature writes it, with its kind; a written default of ``...``
    matches any default."""
    text = {
        inspect.Parameter.VAR_POSITIONAL: f"*{param.name}",
        inspect.Parameter.VAR_KEYWORD: f"**{param.name}",
        inspect.Parameter.KEYWORD_ONLY: f"{param.name} (keyword)",
    }.get(param.kind, param.name)
    if param.default is inspect.Parameter.empty:
        return text
    return text + ("=<a default>" if param.default is Ellipsis else f"={param.default!r}")


def _returns(written: Written, signature: inspect.Signature, path: str) -> list[str]:
    """A written result, a type's name or a tuple of its field names, against the code's
    return annotation."""
    if not written.returns:
        return []
    annotation = signature.return_annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if not written.returns.startswith("("):
        return [] if name == written.returns else [f"returns {name!r}, not {written.returns}"]
    fields = tuple(f.strip() for f in written.returns.strip("()").split(","))
    module = inspect.getmodule(_resolve(path))
    result = getattr(module, name, None)
    got = getattr(result, "_fields", None)
    return [] if got == fields else [f"returns {name} with fields {got}, not {fields}"]


# The doc's @pytest.mark.parametrize needs the signatures at collection; a missing file is a
# failure of its own test below, not an error at collection.
_WRITTEN = written_signatures(DESIGN.read_text()) if DESIGN.exists() else []


def _compared() -> list[tuple[Written, str]]:
    return [(w, path) for w in _WRITTEN if w.key in KNOWN for path in KNOWN[w.key]]


@pytest.mark.parametrize(
    ("written", "path"), _compared(), ids=[f"{w.key}:{w.line}-{path}" for w, path in _compared()]
)
def test_a_signature_written_in_design_md_is_the_code_s(written, path):
    problems = mismatches(written, path, DESIGN.read_text())

    assert not problems, f"{written} ({path}): " + "; ".join(problems)


def test_every_signature_written_is_compared_or_left_out_with_a_reason():
    unknown = [str(w) for w in _WRITTEN if w.key not in KNOWN and w.key not in LEFT_OUT]

    assert not unknown, "add each to KNOWN (what code it states) or LEFT_OUT (why not):\n" + (
        "\n".join(unknown)
    )


def test_every_entry_of_the_tables_is_still_written_in_design_md():
    written = {w.key for w in _WRITTEN}

    assert sorted(set(KNOWN) - written) == [] and sorted(set(LEFT_OUT) - written) == []
    assert len(_compared()) >= 60  # the extraction finds what design.md writes


# -- the parser itself --------------------------------------------------------------------------


def test_a_signature_that_disagrees_is_found_and_named():
    text = "`rope_forward(x, positions, *, inv_freq, interleaved=True)`\n"
    (written,) = written_signatures(text)

    problems = mismatches(written, KNOWN["rope_forward"][0], text)

    assert problems == [
        "design.md has (x, positions, inv_freq (keyword), interleaved (keyword)=True), the code "
        "(x, positions, inv_freq (keyword), interleaved (keyword)=False, attention_factor "
        "(keyword)=1.0, rotary_dim (keyword)=None)"
    ]


def test_fences_tables_and_wrapped_spans_are_read_with_their_lines():
    text = (
        "| layer | constructor | forward |\n|---|---|---|\n"
        "| CrossAttention | `(hidden_size, heads)` | `forward(x, y, mask=None)` |\n\n"
        "a `KVCache(batch,\n  dtype)` and `1/sqrt(D)` and `max(1e-5, ...)`\n"
        "```\ncheck_kernel(kernel, *,\n             seed=0) -> KernelReport\n```\n"
    )

    found = sorted(written_signatures(text), key=lambda w: w.line)

    assert [(w.key, w.params, w.returns, w.line) for w in found] == [
        ("CrossAttention", "hidden_size, heads", "", 3),
        ("CrossAttention.forward", "x, y, mask=None", "", 3),
        ("KVCache", "batch,\n  dtype", "", 5),
        ("sqrt", "D", "", 6),
        ("check_kernel", "kernel, *,\n             seed=0", "KernelReport", 8),
    ]


def test_a_parameter_left_out_is_allowed_only_where_design_md_says_so():
    path = f"{NA}.attention.SelfAttentionV1"
    written = Written("SelfAttentionV1", "d_in, d_out", "", 1)

    assert mismatches(written, path, _NUMPY_RNG) == []
    assert mismatches(written, path, "no word of rng")[0].startswith("rng: EXTRAS cites")
