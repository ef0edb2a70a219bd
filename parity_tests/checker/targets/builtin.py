"""The kernels the CLI checks by default, each with a spec (``checker.specs``), and their known
failures.

Targets: ``F.scaled_dot_product_attention`` with the default dispatch and with each backend that
``torch.nn.attention.sdpa_kernel`` can force on the device; ``torch_attention.functional.attention``
with each backend that runs forward and backward there (forward-only where only the forward runs:
FlexAttention on CPU); ``nn.MultiheadAttention`` through an adapter (identity projections), with
``need_weights=True`` and ``False``; and, where installed, the real third-party kernels of
``checker.targets.third_party``: FlexAttention itself (the "flex" spec; eager, and compiled in a
child process) and Hugging Face's attention functions; on CUDA, the project's own Triton kernel
behind flash-attn's signatures (``triton_targets``). The decode specs' targets (``decode_targets``):
``torch_attention.decode.paged`` behind flash-attn's ``flash_attn_with_kvcache`` and FlashMLA's
``flash_mla_with_kvcache``, and, where installed, transformers' paged attention. A backend that
cannot take a small plain problem on the device is left out (found by trying one). Compiled targets
compile once per shape and dtype (~10-40 s each on a 2-core CPU), so they run a few cases in float32
(``Target.cases``).

A forced backend that refuses a case (the CPU flash kernel has no dropout, say) raises
``KernelUnsupported`` with torch's (or torch_attention's) own reason, and the case is skipped for
that target. Known
failures are listed in ``EXPECTED_FAILURES`` with the reason, and reported as XFAIL, never hidden;
an expected failure that passes is reported as XPASS and fails the run, so the list stays honest.
docs/kernel-verification.md records what each target does.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value width.

Tests: tests/checker/targets/test_builtin.py
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_attention.distributed import ring_attention
from torch_attention.functional import BACKENDS, attention

from .. import specs
from ..battery.catalog import lookup
from ..battery.limits import KernelLimits
from ..pipeline import Kernel, check_kernel
from ..report.rows import KernelReport, KernelUnsupported
from . import adapters, third_party
from . import decode as decode_kernels

SDPA_BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}

# What SDPA says when the forced backend cannot take a problem on this device, dtype or shape.
SDPA_REFUSALS = ("No available kernel", "No viable backend")
# What torch_attention.functional.attention says when a forced backend cannot compute a call.
TORCH_ATTENTION_REFUSAL = "cannot compute this call"


@dataclass(frozen=True)
class Target:
    """A named kernel to check, the dtypes it runs in on the device it was built for, and how
    ``check_kernel`` calls it: its spec, features and limits, forward-only, isolated (with its
    time limit), and ``cases``, the cases it runs whatever battery is asked for (compiled
    kernels; None: the battery asked)."""

    name: str
    kernel: Kernel | str
    dtypes: tuple[str, ...]
    spec: str = "sdpa"
    features: frozenset[str] | None = None
    forward_only: bool = False
    isolate: bool | float = False
    cases: tuple[str, ...] | None = None
    world_size: int | None = None
    limits: KernelLimits | None = None
    timeout: float | None = None

    def check(
        self,
        device: str,
        battery: str | list[str] | tuple[Any, ...],
        seed: int,
        progress: Any = None,
    ) -> KernelReport | None:
        """The target's report on ``battery`` (a battery's name, case names, or cases drawn
        for it: ``battery.fuzz``). None when the target runs none of it: a battery its spec has
        not, a target with its own cases asked for the stress battery, or case names that its
        spec cannot express or its own cases leave out."""
        cases: str | list[str] | tuple[str, ...] | tuple[Any, ...]
        if isinstance(battery, str) and battery not in specs.get(self.spec).batteries:
            return None  # a battery its spec has not (the decode specs' stress battery)
        if isinstance(battery, tuple):
            cases = battery
        elif isinstance(battery, list):
            allowed = self.cases
            cases = [
                name
                for name in battery
                if (allowed is None or name in allowed)
                and _runs_case(self.spec, name, self.features)
            ]
            if not cases:
                return None
        elif self.cases is not None:
            if battery == "stress":
                return None
            cases = self.cases
        else:
            cases = battery
        return check_kernel(
            self.kernel,
            spec=self.spec,
            features=self.features,
            device=device,
            dtypes=self.dtypes,
            cases=cases,
            limits=self.limits,
            forward_only=self.forward_only,
            isolate=self.isolate,
            timeout=self.timeout,
            seed=seed,
            progress=progress,
            world_size=self.world_size,
        )


@dataclass(frozen=True)
class ExpectedFailure:
    """A documented failure: target ``target`` fails case ``case`` (a name, or a pattern of
    ``fnmatch``: "*" every case, "dead-*" every case whose mask has dead rows, as generated
    cases are named by what they hold; in every dtype and on every device unless restricted),
    for ``reason``. With ``detail``, only a failure
    that says it is expected (another failure of the case still fails the run); with
    ``strict=False`` the case may also pass, for a failure that depends on what ran before it."""

    target: str
    case: str
    reason: str
    dtypes: tuple[str, ...] | None = None
    devices: tuple[str, ...] | None = None
    detail: str | None = None  # the failure must say this (a failing row's detail holds it)
    strict: bool = True  # False: the case may pass too (a failure that depends on run order)

    def explains(self, failed_details: list[str]) -> bool:
        """Whether this entry explains a group whose failing rows say ``failed_details``."""
        return self.detail is None or any(self.detail in detail for detail in failed_details)

    def matches(self, target: str, case: str, dtype: str, device: str) -> bool:
        return (
            self.target == target
            and fnmatch.fnmatchcase(case, self.case)
            and (self.dtypes is None or dtype in self.dtypes)
            and (self.devices is None or torch.device(device).type in self.devices)
        )


MHA_NAN_ROWS = (
    "nn.MultiheadAttention with need_weights=True computes softmax itself: a query row with "
    "nothing to attend to gives NaN in the output and in every gradient (SDPA gives 0)"
)
HF_MIN_MASK_ROWS = (
    "Hugging Face's eager attention adds its finfo(dtype).min mask and takes a plain softmax: a "
    "query row with nothing to attend to gets equal weights on every key, so its output is the "
    "mean of V (and its gradients are nonzero) where SDPA and the golden give 0"
)
HF_NAN_ROWS = (
    "Hugging Face's eager attention takes a plain softmax of the masked scores: with the -inf "
    "mask that SDPA's float masks mean, a query row with nothing to attend to gives NaN in the "
    "output and in every gradient"
)
HF_FLEX_HEAD0 = (
    "Hugging Face's flex_attention_forward reads a 4-D tensor mask as score_mask[b][0][q][kv]: "
    "head 0's mask for every head, so a per-head mask (a per-head bias, or per-head dead rows) is "
    "silently wrong on every other head (and, with its finfo.min mask, a dead row is the mean of V)"
)
HF_FLEX_COMPILED = (
    "Hugging Face's flex_attention_forward compiles FlexAttention, and on CPU (torch 2.13) the "
    "compiled code indexing its tensor mask (score_mask[b][0][q][kv]) crashes the process"
)
HF_FLOAT32_SOFTMAX = (
    "Llama's eager attention takes its softmax in float32 whatever the inputs' dtype "
    "(softmax(..., dtype=torch.float32).to(query.dtype)): in float64 every result carries "
    "float32 rounding, ~1e-7 of its scale where the float64 bound is ~1e-12, and a fully "
    "masked row is NaN (its finfo(float64).min mask is -inf in float32)"
)
HF_PAGED_FLOAT32_SOFTMAX = (
    "transformers' eager paged attention takes its softmax in float32 whatever the inputs' dtype "
    "(softmax(..., dtype=torch.float32).to(query.dtype)): in float64 every output carries "
    "float32 rounding, ~1e-7 of its scale where the float64 bound is ~1e-12"
)
FLEX_COMPILED_DYNAMIC = (
    "torch.compile(flex_attention) on CPU (torch 2.13): once it recompiles with dynamic sizes "
    "(automatic dynamic, after earlier shapes in the same process), Inductor's C++ code for a "
    "block mask does not compile (CppCompileError: 'cur_kvSplitSize2' was not declared); which "
    "case meets it depends on the order the shapes were compiled in, and each compiled alone "
    "passes"
)

# Cases are named by what they hold, their mask first: "dead-bool-...", "dead-float-..." (and
# the named "dead-rows-bool", "dead-rows-float") have fully masked rows, "float-..." (and
# "float-mask") a per-head float mask.
_DEAD = "dead-*"
EXPECTED_FAILURES: tuple[ExpectedFailure, ...] = (
    ExpectedFailure("mha[need_weights=True]", _DEAD, MHA_NAN_ROWS),
    ExpectedFailure("hf.llama.eager_attention_forward", _DEAD, HF_MIN_MASK_ROWS,
                    dtypes=("float32", "float16", "bfloat16")),
    ExpectedFailure("hf.gpt2.eager_attention_forward", _DEAD, HF_NAN_ROWS),
    *(
        ExpectedFailure("hf.flex_attention_forward[eager]", case, HF_FLEX_HEAD0)
        for case in ("float-*", _DEAD)
    ),
    *(
        ExpectedFailure("hf.flex_attention_forward", case, HF_FLEX_COMPILED, devices=("cpu",))
        for case in ("causal-n<m", "float-mask", "dead-rows-bool")
    ),
    ExpectedFailure("flex[compiled]", "*", FLEX_COMPILED_DYNAMIC, devices=("cpu",),
                    detail="CppCompileError", strict=False),
    ExpectedFailure(
        "hf.llama.eager_attention_forward", "*", HF_FLOAT32_SOFTMAX, dtypes=("float64",)
    ),
    *(
        ExpectedFailure("hf.paged.eager", case, HF_PAGED_FLOAT32_SOFTMAX, dtypes=("float64",))
        for case in decode_kernels.hf_paged_cases()
    ),
)  # fmt: skip


def expected_failure(target: str, case: str, dtype: str, device: str) -> ExpectedFailure | None:
    """The entry of ``EXPECTED_FAILURES`` for this run, or None."""
    for entry in EXPECTED_FAILURES:
        if entry.matches(target, case, dtype, device):
            return entry
    return None


def builtin_targets(device: str | torch.device, dtypes: tuple[str, ...]) -> list[Target]:
    """Every built-in target that runs on ``device`` in at least one of ``dtypes``."""
    targets = [Target("sdpa", F.scaled_dot_product_attention, dtypes)]
    for name, backend in SDPA_BACKENDS.items():
        available = tuple(d for d in dtypes if _backend_runs(backend, device, d))
        if available:
            features = _sdpa_backend_features(backend, device, available)
            targets.append(Target(f"sdpa[{name}]", forced_sdpa(backend), available,
                                  features=features))  # fmt: skip
    for name in (backend for backend in BACKENDS if backend != "triton"):  # triton_targets
        available = tuple(d for d in dtypes if _torch_attention_runs(name, device, d, True))
        forward = tuple(d for d in dtypes if _torch_attention_runs(name, device, d, False))
        kernel = torch_attention_kernel(name)
        runs = available or forward  # FlexAttention on CPU has no backward
        if runs:
            features = _torch_attention_features(name, device, runs, bool(available))
            targets.append(Target(f"torch_attention[{name}]", kernel, runs, features=features,
                                  forward_only=not available))  # fmt: skip
    for need_weights in (True, False):
        kernel = mha_kernel(need_weights)
        targets.append(
            Target(
                f"mha[need_weights={need_weights}]",
                kernel,
                dtypes,
                features=claimable(kernel, device, dtypes, NO_GQA),
            )
        )
    targets += [
        Target("torch_attention:flash_attn_func", adapters.flash_attn_func, dtypes, "flash"),
        Target(
            "torch_attention:flash_attn_varlen_func",
            adapters.flash_attn_varlen_func,
            dtypes,
            "flash_varlen",
        ),
    ]
    if torch.device(device).type == "cpu":  # the ring spec runs gloo ranks on CPU
        targets.append(Target("ring_attention", ring_attention, dtypes, "ring", world_size=2))
    targets += triton_targets(device, dtypes) + third_party_targets(device, dtypes)
    targets += decode_targets(device, dtypes)
    for spec in specs.registry().values():  # the correct kernels a spec module brings itself
        targets += spec.targets(device, dtypes)
    return targets


def triton_targets(device: str | torch.device, dtypes: tuple[str, ...]) -> list[Target]:
    """The project's Triton kernel behind flash-attn's signatures, on a CUDA device where Triton
    is installed. Never on CPU: there it runs only under Triton's interpreter, minutes per
    battery (docs/triton-kernel.md has the opt-in command)."""
    dtypes = tuple(d for d in dtypes if d != "float64")  # the kernel refuses float64
    cuda = torch.device(device).type == "cuda"
    if not cuda or not dtypes or importlib.util.find_spec("triton") is None:
        return []
    return [
        Target("triton:flash_attn_func", "torch_attention.triton:flash_attn_func", dtypes, "flash"),
        Target(
            "triton:flash_attn_varlen_func",
            "torch_attention.triton:flash_attn_varlen_func",
            dtypes,
            "flash_varlen",
        ),
    ]


NO_GQA = frozenset({"mask", "causal", "dropout", "dv"})


# The few cases a compiled target runs (each shape compiles): plain, causal with N < M, one
# option of the spec each, and the cases of the documented findings.
def _runs_case(spec: str, name: str, features: frozenset[str] | None) -> bool:
    """Whether a target of ``spec`` runs the case called ``name``: one the spec can express."""
    found = specs.get(spec)
    try:
        case = lookup(name, found, features)
    except ValueError:
        return False
    return found.cannot_express(case) is None


COMPILED_FLEX_CASES = ("plain", "causal-br-n<m", "window-tl", "alibi-h")
HF_FLEX_CASES = ("plain", "causal-n<m", "float-mask", "dead-rows-bool")


def third_party_targets(device: str | torch.device, dtypes: tuple[str, ...]) -> list[Target]:
    """FlexAttention and Hugging Face's attention functions, where installed."""
    cpu = torch.device(device).type == "cpu"
    compiled_dtypes = tuple(d for d in dtypes if d == "float32")
    targets = []
    if third_party.flex_available():
        from torch.nn.attention.flex_attention import flex_attention

        flex_features = frozenset({"mask", "causal", "window", "softcap", "alibi", "gqa", "dv"})
        targets.append(Target("flex", flex_attention, dtypes, "flex", flex_features | {"lse"}, cpu))
        if compiled_dtypes:
            targets.append(
                Target(
                    "flex[compiled]",
                    third_party.compiled_flex_attention,
                    compiled_dtypes,
                    "flex",
                    # torch.compile of FlexAttention on CPU refuses return_lse (inference only).
                    flex_features if cpu else flex_features | {"lse"},
                    cpu,
                    isolate=True,
                    cases=COMPILED_FLEX_CASES,
                )
            )
    if not third_party.transformers_available():
        return targets
    hf_features = frozenset({"mask", "causal", "gqa", "dv"})
    targets += [
        Target("hf.sdpa_attention_forward", third_party.hf_sdpa, dtypes),
        Target("hf.llama.eager_attention_forward", third_party.hf_llama_eager, dtypes),
        Target("hf.gpt2.eager_attention_forward", third_party.hf_gpt2_eager, dtypes,
               features=NO_GQA),
        Target("hf.flex_attention_forward[eager]", third_party.hf_flex_eager, dtypes,
               features=hf_features, forward_only=cpu),
    ]  # fmt: skip
    if compiled_dtypes:
        targets.append(
            Target(
                "hf.flex_attention_forward",
                third_party.hf_flex,
                compiled_dtypes,
                features=hf_features,
                forward_only=cpu,
                isolate=True,
                cases=HF_FLEX_CASES,
            )
        )
    return targets


def decode_targets(device: str | torch.device, dtypes: tuple[str, ...]) -> list[Target]:
    """The decode specs' targets (``checker.targets.decode``), each running its spec's own
    battery whatever battery is asked for (none of the stress battery)."""
    targets = [
        Target("torch_attention:flash_attn_with_kvcache", decode_kernels.flash_attn_with_kvcache,
               dtypes, "flash_kvcache"),
        Target("torch_attention:flash_mla_with_kvcache", decode_kernels.flash_mla_with_kvcache,
               dtypes, "flash_mla"),
    ]  # fmt: skip
    if third_party.transformers_available():
        features, cases = decode_kernels.HF_PAGED_FEATURES, decode_kernels.hf_paged_cases()
        targets += [
            Target("hf.paged.eager", decode_kernels.hf_paged_eager, dtypes, "flash_kvcache",
                   features, cases=cases),
            Target("hf.paged.sdpa", decode_kernels.hf_paged_sdpa, dtypes, "flash_kvcache",
                   features, cases=cases),
        ]  # fmt: skip
    return targets


def forced_sdpa(backend: SDPBackend) -> Kernel:
    """SDPA restricted to one backend; a case the backend refuses raises ``KernelUnsupported``."""

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(
                        query,
                        key,
                        value,
                        attn_mask=attn_mask,
                        dropout_p=dropout_p,
                        is_causal=is_causal,
                        scale=scale,
                        enable_gqa=enable_gqa,
                    )
            except RuntimeError as exc:
                if not any(refusal in str(exc) for refusal in SDPA_REFUSALS):
                    raise
                reasons = [_strip_location(str(w.message)) for w in caught]
                raise KernelUnsupported("; ".join(r for r in reasons if r) or str(exc)) from exc

    kernel.__name__ = f"sdpa[{backend.name.lower()}]"
    return kernel


def _strip_location(message: str) -> str:
    message = re.sub(r"\s*\(Triggered internally at .*\)\s*$", "", message, flags=re.S).strip()
    return "" if message.endswith("not used because:") else message


@functools.lru_cache(maxsize=32)
def _backend_runs(backend: SDPBackend, device: str | torch.device, dtype: str) -> bool:
    """Whether SDPA forced to ``backend`` runs a small problem on ``device`` in ``dtype``."""
    return _runs(forced_sdpa(backend), device, dtype)


@functools.lru_cache(maxsize=32)
def _torch_attention_runs(
    backend: str, device: str | torch.device, dtype: str, backward: bool
) -> bool:
    """Whether ``torch_attention``'s ``backend`` runs a small problem on ``device`` in ``dtype``,
    with its backward or forward only (FlexAttention has no backward on CPU, say)."""
    return _runs(torch_attention_kernel(backend), device, dtype, backward)


@functools.lru_cache(maxsize=32)
def _sdpa_backend_features(
    backend: SDPBackend, device: str | torch.device, dtypes: tuple[str, ...]
) -> frozenset[str] | None:
    return claimable(forced_sdpa(backend), device, dtypes)


@functools.lru_cache(maxsize=32)
def _torch_attention_features(
    backend: str, device: str | torch.device, dtypes: tuple[str, ...], backward: bool
) -> frozenset[str] | None:
    return claimable(torch_attention_kernel(backend), device, dtypes, backward=backward)


def claimable(
    kernel: Kernel,
    device: str | torch.device,
    dtypes: tuple[str, ...],
    features: frozenset[str] | None = None,
    backward: bool = True,
) -> frozenset[str] | None:
    """The SDPA-signature features of ``features`` (None: all of the spec's) that ``kernel``
    takes on a small problem in the first dtype of ``dtypes`` (the backends' refusals do not
    depend on it), rather than raising ``KernelUnsupported`` (the CPU flash kernel refuses
    dropout and Dv != D, say); None when that is all of the spec's. The battery is then built
    for those features, so that a narrow kernel is judged on every pair of what it does rather
    than skipping most cases."""
    wanted = specs.SPEC_FEATURES["sdpa"] if features is None else features
    claimed = frozenset(f for f in wanted if _takes(kernel, device, dtypes[0], f, backward))
    return None if claimed == specs.SPEC_FEATURES["sdpa"] else claimed


def _takes(kernel: Kernel, device: str | torch.device, dtype: str, feature: str,
           backward: bool) -> bool:  # fmt: skip
    """Whether ``kernel`` takes a (1, 4, 8, 16) problem that needs ``feature``."""
    make = functools.partial(torch.randn, device=device, dtype=getattr(torch, dtype))
    q, k, v = make(1, 4, 8, 16), make(1, 4, 8, 16), make(1, 4, 8, 16)
    kwargs: dict[str, Any] = {}
    if feature == "dropout":
        kwargs["dropout_p"] = 0.5
    elif feature == "dv":
        v = make(1, 4, 8, 32)
    elif feature == "mask":
        kwargs["attn_mask"] = torch.ones(8, 8, dtype=torch.bool, device=device).tril()
    elif feature == "causal":
        kwargs["is_causal"] = True
    elif feature == "gqa":
        k, v = make(1, 2, 8, 16), make(1, 2, 8, 16)
        kwargs["enable_gqa"] = True
    for t in (q, k, v):
        t.requires_grad_(backward)
    try:
        out = kernel(q, k, v, **kwargs)
        if backward:
            out.sum().backward()
    except KernelUnsupported:
        return False
    return True


def _runs(kernel: Kernel, device: str | torch.device, dtype: str, backward: bool = True) -> bool:
    """Whether ``kernel`` takes a plain (1, 1, 8, 64) problem forward (and backward), rather than
    raising ``KernelUnsupported``."""
    q = torch.randn(1, 1, 8, 64, device=device, dtype=getattr(torch, dtype))
    try:
        if backward:
            q.requires_grad_(True)
            kernel(q, q, q).sum().backward()
        else:
            kernel(q, q, q)
    except KernelUnsupported:
        return False
    return True


def torch_attention_kernel(backend: str) -> Kernel:
    """``torch_attention.functional.attention`` with ``backend``, behind the SDPA signature. A
    call the backend says it cannot compute raises ``KernelUnsupported`` with its reason."""

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):  # fmt: skip
        try:
            return attention(
                query,
                key,
                value,
                causal=is_causal,
                attn_mask=attn_mask,
                scale=scale,
                enable_gqa=enable_gqa,
                dropout_p=dropout_p,
                backend=backend,
            )
        except ValueError as exc:
            if TORCH_ATTENTION_REFUSAL not in str(exc):
                raise
            raise KernelUnsupported(str(exc)) from exc

    kernel.__name__ = f"torch_attention[{backend}]"
    return kernel


def mha_kernel(need_weights: bool) -> Kernel:
    """``nn.MultiheadAttention`` behind the SDPA signature.

    Heads are merged into the model width H*D and the projections set to the identity (exact in
    every dtype), so the module's own attention is what gets checked. A given ``scale`` is folded
    into the queries, since the module always scales by 1 / sqrt(D). SDPA's bool mask (True = may
    attend) is inverted into the module's (True = masked); the causal mask is passed explicitly.
    """

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        b, h, n, d = query.shape
        m, dv = key.shape[-2], value.shape[-1]
        if dv != d:
            raise KernelUnsupported("nn.MultiheadAttention needs Dv == D")
        module = _identity_mha(h * d, h, dropout_p, query.device, query.dtype)
        if scale is not None:
            query = query * (scale * math.sqrt(d))
        merged = [t.transpose(1, 2).reshape(b, -1, h * d) for t in (query, key, value)]
        out, _ = module(
            *merged,
            attn_mask=_mha_mask(attn_mask, is_causal, b, h, n, m, query.device),
            need_weights=need_weights,
        )
        return out.reshape(b, n, h, d).transpose(1, 2)  # (B, N, H*D) -> (B, H, N, D)

    kernel.__name__ = f"mha[need_weights={need_weights}]"
    return kernel


def _identity_mha(
    width: int, heads: int, dropout_p: float, device: torch.device, dtype: torch.dtype
) -> nn.MultiheadAttention:
    module = nn.MultiheadAttention(
        width, heads, dropout=dropout_p, bias=False, batch_first=True, device=device, dtype=dtype
    )
    eye = torch.eye(width, device=device, dtype=dtype)
    with torch.no_grad():
        module.in_proj_weight.copy_(eye.repeat(3, 1))  # [W_q; W_k; W_v] = [I; I; I], (3C, C)
        module.out_proj.weight.copy_(eye)
    return module.requires_grad_(False)


def _mha_mask(attn_mask, is_causal, b, h, n, m, device) -> torch.Tensor | None:
    """SDPA's mask as the module's: bool True = masked, or float added; (N, M) or (B*H, N, M)."""
    if is_causal:
        return ~torch.ones(n, m, dtype=torch.bool, device=device).tril()
    if attn_mask is None:
        return None
    mask = attn_mask.expand(b, h, n, m).reshape(b * h, n, m)  # (..., N, M) -> (B*H, N, M)
    return ~mask if mask.dtype == torch.bool else mask
