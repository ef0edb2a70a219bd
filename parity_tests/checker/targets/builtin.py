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

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from torch_attention.distributed import ring_attention
from torch_attention.functional import BACKENDS

from .. import specs
from ..battery.catalog import lookup
from ..battery.limits import KernelLimits
from ..pipeline import Kernel, check_kernel
from ..report.rows import KernelReport
from . import adapters, third_party
from . import decode as decode_kernels
from .torch_kernels import (
    SDPA_BACKENDS,
    backend_runs,
    claimable,
    forced_sdpa,
    mha_kernel,
    sdpa_backend_features,
    torch_attention_features,
    torch_attention_kernel,
    torch_attention_runs,
)


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


def builtin_targets(device: str | torch.device, dtypes: tuple[str, ...]) -> list[Target]:
    """Every built-in target that runs on ``device`` in at least one of ``dtypes``."""
    targets = [Target("sdpa", F.scaled_dot_product_attention, dtypes)]
    for name, backend in SDPA_BACKENDS.items():
        available = tuple(d for d in dtypes if backend_runs(backend, device, d))
        if available:
            features = sdpa_backend_features(backend, device, available)
            targets.append(Target(f"sdpa[{name}]", forced_sdpa(backend), available,
                                  features=features))  # fmt: skip
    for name in (backend for backend in BACKENDS if backend != "triton"):  # triton_targets
        available = tuple(d for d in dtypes if torch_attention_runs(name, device, d, True))
        forward = tuple(d for d in dtypes if torch_attention_runs(name, device, d, False))
        kernel = torch_attention_kernel(name)
        runs = available or forward  # FlexAttention on CPU has no backward
        if runs:
            features = torch_attention_features(name, device, runs, bool(available))
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
