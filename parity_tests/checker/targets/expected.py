"""The documented failures of the built-in targets (``targets.builtin``), each with its reason:
reported as XFAIL, never hidden; an expected failure that passes is XPASS and fails the run, so
the list stays honest. docs/kernel-verification.md records what each target does.

Tests: tests/checker/targets/test_builtin.py
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch

from . import decode as decode_kernels


@dataclass(frozen=True)
class ExpectedFailure:
    """A documented failure: target ``target`` fails case ``case`` (a name, or a pattern of
    ``fnmatch``: "*" every case, "dead-*" every case whose mask has dead rows, as generated
    cases are named by what they hold; in every dtype and on every device unless restricted),
    for ``reason``. With ``detail``, only a failure
    that says it is expected (another failure of the case still fails the run); with
    ``strict=False`` the case may also pass, for a failure that depends on what ran before it or
    on the seed (a wrong result that only rounding shows)."""

    target: str
    case: str
    reason: str
    dtypes: tuple[str, ...] | None = None
    devices: tuple[str, ...] | None = None
    detail: str | None = None  # the failure must say this (a failing row's detail holds it)
    strict: bool = True  # False: the case may pass too (run order or seed decides)

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
HF_FLEX_HEAD0_SHIFTED = (
    "Hugging Face's flex_attention_forward reads a 4-D tensor mask as score_mask[b][0][q][kv]: "
    "with the 'shifted' mask (rows shifted by -1e5, per head) every head gets head 0's shifts, "
    "which the softmax does not see, but the scores of a row head 0 shifts are rounded at 1e5 "
    "(1.5e-11 in float64) where the input left them unshifted: the output can exceed the bound "
    "(float64, seed 5: 2.2e-12 against 2.1e-12, 2.5 times the baseline's error) or pass, by seed"
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
HALF_MASK_ADDED = (
    "adds a float mask to the scores in the inputs' dtype: a row shifted by a large finite "
    "constant (the mask 'shifted': -1e5, -65,504 in float16) keeps its scores only to that "
    "dtype's spacing there (32 in float16, 512 in bfloat16), so the softmax of such a row is "
    "noise where the answer is the unshifted row's; SDPA's math path and its fused kernels add "
    "the mask in float32 and pass"
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
# "float-mask") a per-head float mask, "shifted-..." rows shifted far below zero.
_DEAD = "dead-*"
_SHIFTED = "shifted-*"  # a finite mask shifting about half the rows by -1e5
_HALF = ("float16", "bfloat16")
EXPECTED_FAILURES: tuple[ExpectedFailure, ...] = (
    ExpectedFailure("mha[need_weights=True]", _DEAD, MHA_NAN_ROWS),
    ExpectedFailure("hf.llama.eager_attention_forward", _DEAD, HF_MIN_MASK_ROWS,
                    dtypes=("float32", "float16", "bfloat16")),
    ExpectedFailure("hf.gpt2.eager_attention_forward", _DEAD, HF_NAN_ROWS),
    *(
        ExpectedFailure(target, _SHIFTED, HALF_MASK_ADDED, dtypes=_HALF)
        for target in ("mha[need_weights=True]", "hf.llama.eager_attention_forward",
                       "hf.gpt2.eager_attention_forward")
    ),
    *(
        ExpectedFailure("hf.flex_attention_forward[eager]", case, HF_FLEX_HEAD0)
        for case in ("float-*", _DEAD)
    ),
    ExpectedFailure(
        "hf.flex_attention_forward[eager]", _SHIFTED, HF_FLEX_HEAD0_SHIFTED, strict=False
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
