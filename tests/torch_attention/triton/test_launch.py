"""The ``"triton"`` backend of ``functional.attention`` and ``varlen_attention``
(``torch_attention/triton/launch.py`` and the kernels it launches), on CPU under Triton's
interpreter (pinned blocks of 16), on a GPU where there is one.

The oracle is the float64 NumPy golden (``attention_forward`` / ``attention_backward``,
``varlen_attention_*``) on the inputs rounded to the tested dtype: out, lse, dq, dk, dv, dsinks,
with a random upstream gradient of lse (dlse) as well as of out; the slopes' gradient, which NumPy
does not give, against torch's "math" backend in float64 (autograd). Each tensor is judged by the
kernel checker's policy (``parity_tests.tolerances``, ``checker.judge``) against the plain
same-dtype baseline (``checker.golden.attention_baseline``; the sink merged into it): the kernel
multiplies in the inputs' dtype, as flash-attn does, so float16 is not the "rounded once" result
that ``FLOAT16_RTOL`` describes. Lengths 1, 15-17 and 33 sit on both sides of the block edges."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from numpy_attention.functional import attention_backward, attention_forward
from numpy_attention.varlen import varlen_attention_backward, varlen_attention_forward
from parity_tests.checker.golden.attention_baseline import attention_scores, plain_attention
from parity_tests.checker.judge.policy import judge_keep, judge_lse, judge_tensor
from torch_attention import backends, varlen_attention
from torch_attention.functional import attention
from torch_attention.merge import merge_attention
from torch_attention.rules import prepare

from ...conftest import SEED, to_numpy
from .conftest import NEEDS_TRITON

pytest.importorskip("triton", reason=NEEDS_TRITON)
from torch_attention.triton import dropout_mask, launch  # noqa: E402

BR = "bottom-right"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Problem(NamedTuple):
    """float64 arrays that the tested dtype holds exactly, and the call's options (NumPy
    arrays for the slopes and sinks)."""

    q: np.ndarray  # (B, H, N, D)
    k: np.ndarray  # (B, H_kv, M, D)
    v: np.ndarray  # (B, H_kv, M, Dv)
    dout: np.ndarray  # (B, H, N, Dv)
    dlse: np.ndarray  # (B, H, N)
    options: dict[str, Any]


def make_problem(
    dtype: str,
    *,
    batch: int = 1,
    heads: int = 2,
    kv_heads: int | None = None,
    n: int = 17,
    m: int = 20,
    d: int = 16,
    dv: int = 24,
    logits: float = 1.0,
    alibi: str | None = None,
    sinks: bool = False,
    **options: Any,
) -> Problem:
    """Random inputs whose scores spread about ``logits``; ALiBi slopes "H" (H,) or "BH"
    (B, H); sinks (H,) when asked for. Dv != D everywhere: the scale is 1 / sqrt(D)."""
    rng = np.random.default_rng([SEED, n, m, d, dv, heads, batch])
    kv_heads = heads if kv_heads is None else kv_heads
    stretch = np.sqrt(logits)
    q = rng.standard_normal((batch, heads, n, d)) * stretch
    k = rng.standard_normal((batch, kv_heads, m, d)) * stretch
    v = rng.standard_normal((batch, kv_heads, m, dv))
    q, k, v = (_rounded(t, dtype) for t in (q, k, v))
    if kv_heads != heads:
        options["enable_gqa"] = True
    if alibi is not None:
        shape = (heads,) if alibi == "H" else (batch, heads)
        options["alibi_slopes"] = rng.uniform(0.05, 0.6, shape)
    if sinks:
        options["sinks"] = _rounded(rng.standard_normal(heads), dtype)
    dout = rng.standard_normal((batch, heads, n, dv))
    return Problem(q, k, v, dout, rng.standard_normal((batch, heads, n)), options)


def _rounded(t: np.ndarray, dtype: str) -> np.ndarray:
    return torch.from_numpy(t).to(DTYPES[dtype]).double().numpy()


def golden(problem: Problem) -> dict[str, np.ndarray]:
    """out, lse, dq, dk, dv (and dsinks) from NumPy in float64; dslopes from torch's "math"
    backend in float64."""
    q, k, v, dout, dlse, options = problem
    result = attention_forward(q, k, v, return_lse=True, **options)
    grads = attention_backward(dout, result.ctx, dlse=dlse)
    gold = {"out": result.out, "lse": result.lse, "dq": grads.dq, "dk": grads.dk, "dv": grads.dv}
    if grads.dsinks is not None:
        gold["dsinks"] = grads.dsinks
    if "alibi_slopes" in options:
        gold["dslopes"] = _torch_run(problem, torch.float64, "math", "cpu")["dslopes"]
    return gold


def kernel(problem: Problem, dtype: str, device: str, strided: bool = False) -> dict:
    return _torch_run(problem, DTYPES[dtype], "triton", device, strided)


def _torch_run(
    problem: Problem, dtype: torch.dtype, backend: str, device: str, strided: bool = False
) -> dict:
    """``functional.attention`` on ``backend``: out, lse and the gradients of sum(out * dout) +
    sum(lse * dlse), as float64 arrays. ``strided``: q, k, v as views of larger buffers."""
    inputs = {name: _tensor(t, dtype, device) for name, t in zip("qkv", problem[:3], strict=True)}
    if strided:
        inputs = {name: _strided_view(t) for name, t in inputs.items()}
    options = dict(problem.options)
    if "sinks" in options:
        inputs["sinks"] = options["sinks"] = _tensor(options["sinks"], dtype, device)
    if "alibi_slopes" in options:  # float32 slopes, as flash-attn takes them
        slope_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        slopes = _tensor(options["alibi_slopes"], slope_dtype, device)
        inputs["slopes"] = options["alibi_slopes"] = slopes
    result = attention(
        inputs["q"], inputs["k"], inputs["v"], backend=backend, return_lse=True, **options
    )
    return _with_grads(result.out, result.lse, inputs, problem)


def baseline(problem: Problem, dtype: str) -> dict[str, np.ndarray]:
    """The checker's plain attention in ``dtype`` (``plain_attention``) and the log-sum-exp of
    its scores (``attention_scores``; the checker's own lse is detached, which would hide a
    wrong dlse term), the sink merged in as a key set of one logit with value 0
    (docs/derivations/sinks.md), gradients by autograd."""
    torch_dtype = DTYPES[dtype]
    qkv = zip("qkv", problem[:3], strict=True)
    inputs = {name: _tensor(t, torch_dtype, "cpu") for name, t in qkv}
    options = dict(problem.options)
    sinks = options.pop("sinks", None)
    if "alibi_slopes" in options:
        slopes = _tensor(options["alibi_slopes"], torch_dtype, "cpu")
        inputs["slopes"] = options["alibi_slopes"] = slopes
    causal = options.pop("causal", False)
    keep = options.pop("dropout_mask", None)
    keep = None if keep is None else torch.from_numpy(keep)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    out = plain_attention(q, k, v, is_causal=causal, keep=keep, **options)
    options.pop("dropout_p", None)
    scores = attention_scores(q, k, is_causal=causal, **options)  # (B, H, N, M)
    dead = torch.isneginf(scores).all(dim=-1)  # rows with nothing to see: lse -inf, no gradient
    lse = torch.logsumexp(scores.masked_fill(dead[..., None], 0.0), dim=-1)
    lse = lse.masked_fill(dead, float("-inf"))
    if sinks is not None:
        inputs["sinks"] = _tensor(sinks, torch_dtype, "cpu")
        sink_lse = inputs["sinks"][:, None].expand(lse.shape)  # (H,) -> (B, H, N)
        out, lse = merge_attention(out, lse, torch.zeros_like(out), sink_lse)
    return _with_grads(out, lse, inputs, problem)


def _tensor(t: np.ndarray, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(t, dtype=dtype, device=device, requires_grad=True)


def _strided_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` (B, H, L, W) with the same values as a view of a larger buffer: laid out (L, W, H,
    B) (no unit stride on the last axis), with a margin on every axis (a nonzero offset), so
    that every stride and the offset differ from a contiguous tensor's. The view keeps its
    gradient (``retain_grad``)."""
    b, h, length, width = t.shape
    buffer = torch.zeros(length + 2, width + 3, h + 1, b + 1, dtype=t.dtype, device=t.device)
    view = buffer[1 : length + 1, 2 : width + 2, 1:, 1:].permute(3, 2, 0, 1)  # (B, H, L, W)
    with torch.no_grad():
        view.copy_(t)
    leaf = buffer.requires_grad_(True)
    view = leaf[1 : length + 1, 2 : width + 2, 1:, 1:].permute(3, 2, 0, 1)
    view.retain_grad()
    return view


def _with_grads(out: torch.Tensor, lse: torch.Tensor, inputs: dict, problem: Problem) -> dict:
    dout = torch.from_numpy(problem.dout).to(out.device)
    dlse = torch.from_numpy(problem.dlse).to(out.device)
    upstream = (out.double() * dout).sum() + (lse.double() * dlse).nan_to_num(0.0).sum()
    upstream.backward()
    result = {"out": _float64(out), "lse": _float64(lse)}
    names = {"q": "dq", "k": "dk", "v": "dv", "sinks": "dsinks", "slopes": "dslopes"}
    for name, t in inputs.items():
        result[names[name]] = _float64(t.grad)
    return result


def _float64(t: torch.Tensor) -> np.ndarray:
    return to_numpy(t.double())  # NumPy has no bfloat16


def assert_judged(results: dict, gold: dict, base: dict, dtype: str) -> None:
    """Every golden tensor of the kernel's results within the checker's bound."""
    assert results.keys() == gold.keys()
    for name, expected in gold.items():
        if name == "lse":
            row = judge_lse("triton", dtype, results[name], expected, base[name])
        else:
            row = judge_tensor("triton", dtype, name, results[name], expected, base[name])
        assert row.verdict == "pass", f"{name}: {row.verdict}, {row.error:.3e} > {row.bound:.3e}"


def check(problem: Problem, dtype: str, device: str) -> None:
    assert_judged(kernel(problem, dtype, device), golden(problem), baseline(problem, dtype), dtype)


# -- every option, alone --------------------------------------------------------------------


OPTIONS = {
    "plain": {},
    "scale": {"scale": 0.3},
    "causal": {"causal": True},
    "causal-bottom-right": {"causal": True, "align": BR},
    "window": {"window": (3, 5)},
    "window-left-bottom-right": {"window": (4, None), "align": BR},
    "softcap": {"softcap": 2.0, "logits": 30.0},
    "alibi-h": {"alibi": "H", "align": BR},
    "alibi-bh": {"alibi": "BH", "batch": 2},
    "sinks": {"sinks": True},
    "gqa": {"heads": 4, "kv_heads": 2},
    # Blocks of 16: query block 48 walks a left-edge, an interior and a diagonal key block, key
    # block 16 a diagonal, an interior and a left-edge query block (pipeline.interior_*).
    "window-edges-and-interior": {"window": (40, 0), "n": 80, "m": 80, "d": 16, "dv": 16},
}


@pytest.mark.parametrize("name", OPTIONS)
def test_every_option_matches_the_golden(name, device):
    check(make_problem("float32", **OPTIONS[name]), "float32", device)


# -- block edges and rows with nothing to see -------------------------------------------------


@pytest.mark.parametrize(
    ("n", "m", "sinks"), [(1, 33, False), (16, 16, True), (33, 17, True), (17, 15, False)]
)
def test_lengths_around_the_blocks_with_dead_rows(n, m, sinks, device):
    """Causal bottom-right with N > M leaves the first N - M rows nothing to see (out 0, lse
    -inf, gradient 0); a sink gives them lse = the sink logit instead."""
    problem = make_problem("float32", n=n, m=m, causal=True, align=BR, sinks=sinks)
    check(problem, "float32", device)


# -- float16 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"causal": True, "align": BR, "window": (5, None), "softcap": 2.0, "logits": 30.0,
         "alibi": "BH", "batch": 2, "sinks": True, "kv_heads": 1},
        {"window": (4, 2), "alibi": "H", "n": 33, "m": 17},
    ],
    ids=["causal-br-window-softcap-alibi-sinks-gqa", "window-alibi"],
)  # fmt: skip
def test_float16(options, device):
    check(make_problem("float16", **options), "float16", device)


@pytest.mark.skipif(launch.interpreted(), reason="the interpreter mishandles bfloat16 (refused)")
def test_bfloat16_on_a_gpu(device):
    options = {"causal": True, "align": BR, "softcap": 2.0, "logits": 30.0, "alibi": "H",
               "sinks": True, "kv_heads": 1}  # fmt: skip
    check(make_problem("bfloat16", **options), "bfloat16", device)


# -- dropout: the kernel's own keep-mask, read back --------------------------------------------


def test_dropout_is_the_golden_with_the_kernels_keep_mask(device):
    """The forward and both backward passes draw one keep-mask from the call's seed:
    ``dropout_mask`` reads it back, and with it the golden's dropout is the kernel's."""
    problem = make_problem("float32", causal=True, align=BR, dropout_p=0.3)
    torch.manual_seed(SEED)
    results = kernel(problem, "float32", device)
    torch.manual_seed(SEED)
    keep = dropout_mask(launch.draw_seed(0.3, device), 0.3, (1, 2, 17, 20), device)
    masked = problem._replace(options={**problem.options, "dropout_mask": to_numpy(keep)})

    assert_judged(results, golden(masked), baseline(masked, "float32"), "float32")


def test_the_keep_mask_keeps_one_minus_p(device):
    keep = dropout_mask(12345, 0.3, (1, 32, 256), device)

    assert judge_keep("triton", "float32", 0.3, to_numpy(keep)).verdict == "pass"


def test_the_seed_is_a_tensor_on_the_device_that_the_kernels_read(device):
    """No host round trip (a CUDA graph replaying the call draws a fresh key): the seed is
    drawn on the inputs' device, and the kernels read the key it holds."""
    torch.manual_seed(SEED)
    seed = launch.draw_seed(0.3, device)
    torch.manual_seed(SEED)

    assert seed.dtype == torch.int64 and seed.shape == (1,) and seed.device.type == device
    assert torch.equal(launch.draw_seed(0.3, device), seed)
    assert launch.draw_seed(0.0, device) is None
    assert torch.equal(dropout_mask(seed, 0.3, (2, 9, 40), device),
                       dropout_mask(int(seed.item()), 0.3, (2, 9, 40), device))  # fmt: skip


# -- layouts, empty problems, determinism -------------------------------------------------------


def test_any_strides_and_offsets(device):
    problem = make_problem("float32", causal=True, kv_heads=1, alibi="H", sinks=True)
    results = kernel(problem, "float32", device, strided=True)

    assert_judged(results, golden(problem), baseline(problem, "float32"), "float32")


def test_any_leading_axes(device):
    """q (B1, B2, H, N, D): the leading axes are flattened into the kernel's batch."""
    problem = make_problem("float32", batch=2, alibi="H", sinks=True, causal=True)
    q, k, v, dout, dlse = (t.reshape(2, 1, *t.shape[1:]) for t in problem[:5])
    check(Problem(q, k, v, dout, dlse, problem.options), "float32", device)


@pytest.mark.parametrize(("n", "m"), [(0, 5), (5, 0)])
def test_no_queries_or_no_keys(n, m, device):
    check(make_problem("float32", n=n, m=m, sinks=True), "float32", device)


def test_the_backward_is_deterministic(device):
    """dq, dk, dv and the slopes' gradient are each summed by one program in a fixed order:
    the same call gives the same bits."""
    problem = make_problem("float32", causal=True, kv_heads=1, alibi="H")
    first, second = kernel(problem, "float32", device), kernel(problem, "float32", device)

    for name, value in first.items():
        assert np.array_equal(value, second[name], equal_nan=True), name


# -- packed sequences ---------------------------------------------------------------------------

SEQLENS = ((17, 20), (0, 5), (3, 0), (16, 17))  # S = 4: an empty query and an empty key set


def test_packed_sequences_run_in_one_launch(device):
    """``varlen_attention(backend="triton")``: causal bottom-right per sequence, GQA, softcap,
    ALiBi (S, H) and sinks, against NumPy's packed golden."""
    rng = np.random.default_rng(SEED)
    total_q, total_k = sum(n for n, _ in SEQLENS), sum(m for _, m in SEQLENS)
    q = rng.standard_normal((total_q, 2, 16))
    k, v = rng.standard_normal((total_k, 1, 16)), rng.standard_normal((total_k, 1, 24))
    dout, dlse = rng.standard_normal((total_q, 2, 24)), rng.standard_normal((2, total_q))
    cu_q = np.cumsum([0] + [n for n, _ in SEQLENS])
    cu_k = np.cumsum([0] + [m for _, m in SEQLENS])
    options = {"causal": True, "align": BR, "softcap": 3.0, "enable_gqa": True}
    slopes, sinks = rng.uniform(0.05, 0.6, (len(SEQLENS), 2)), rng.standard_normal(2)
    forward = varlen_attention_forward(
        q, k, v, cu_q, cu_k, alibi_slopes=slopes, sinks=sinks, return_lse=True, **options
    )
    grads = varlen_attention_backward(dout, forward.ctx, dlse=dlse)
    gold = {"out": forward.out, "lse": forward.lse, "dq": grads.dq, "dk": grads.dk,
            "dv": grads.dv, "dsinks": grads.dsinks}  # fmt: skip

    def run(dtype: torch.dtype, backend: str, on: str) -> dict:
        inputs = {name: _tensor(t, dtype, on) for name, t in zip("qkv", (q, k, v), strict=True)}
        inputs["slopes"], inputs["sinks"] = _tensor(slopes, dtype, on), _tensor(sinks, dtype, on)
        result = varlen_attention(
            inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k, alibi_slopes=inputs["slopes"],
            sinks=inputs["sinks"], backend=backend, return_lse=True, **options,
        )  # fmt: skip
        upstream = (result.out.double() * torch.from_numpy(dout).to(on)).sum()
        upstream += (result.lse.double() * torch.from_numpy(dlse).to(on)).nan_to_num(0.0).sum()
        upstream.backward()
        results = {"out": result.out, "lse": result.lse}
        results |= {"d" + name: t.grad for name, t in inputs.items()}
        return {name: to_numpy(t).astype(np.float64) for name, t in results.items()}

    gold["dslopes"] = run(torch.float64, "math", "cpu")["dslopes"]
    assert_judged(run(torch.float32, "triton", device), gold, run(torch.float32, "math", "cpu"),
                  "float32")  # fmt: skip


# -- launches: grids within CUDA's limits, every argument by name --------------------------------


def test_the_grid_of_2048_sequences_of_32_heads_is_within_cudas_limits():
    """2,048 x 32 = 65,536 (batch element, head) pairs, one more than CUDA allows on grid axes
    1 and 2: every program is on axis 0, whose limit is 2^31 - 1."""
    for length, block in ((4096, 128), (4096, 16), (1, 16), (131072, 64)):
        grid = launch.grid(length, block, 2048 * 32)

        assert grid[0] == -(-length // block) * 2048 * 32 and grid[0] <= 2**31 - 1, grid
        assert grid[1] <= 65535 and grid[2] <= 65535, grid


def test_a_grid_past_2_to_the_31_programs_is_refused_naming_it():
    with pytest.raises(ValueError, match="programs .* exceed CUDA's 2147483647 on one grid axis"):
        launch.grid(2**22, 16, 2**17)


def _recorded_launches(monkeypatch) -> list:
    """Every ``launch._run`` call as (kernel, length, block, arguments), each still run."""
    calls, run = [], launch._run

    def recording(kernel, length, block, triton_launch, arguments, configs):
        calls.append((kernel, length, block, arguments))
        run(kernel, length, block, triton_launch, arguments, configs)

    monkeypatch.setattr(launch, "_run", recording)
    return calls


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["mha", "gqa"])
def test_every_launch_names_every_argument(kv_heads, monkeypatch, device):
    """The forward, dK/dV and dQ launches pass each of the kernel's arguments by its name (the
    blocks the autotuner or the pinned configuration adds); the seed is the device tensor;
    under GQA the dK/dV kernel writes float32 per query head (summed afterwards), without it
    straight into the gradients."""
    calls = _recorded_launches(monkeypatch)
    problem = make_problem("float16", kv_heads=kv_heads, causal=True, alibi="H", sinks=True,
                           softcap=2.0, dropout_p=0.2)  # fmt: skip

    kernel(problem, "float16", device)

    assert [c[0] for c in calls] == [launch.forward.attention_forward_kernel,
                                     launch.backward.attention_backward_dkdv_kernel,
                                     launch.backward.attention_backward_dq_kernel]  # fmt: skip
    for kernel_fn, _, _, arguments in calls:
        assert set(arguments) | {"BLOCK_M", "BLOCK_N"} == set(kernel_fn.arg_names)
        assert isinstance(arguments["seed"], torch.Tensor)
        assert arguments["seed"].device.type == device
    dk = calls[1][3]["dk"]
    assert dk.shape[1] == 2 and dk.dtype == (torch.float32 if kv_heads == 1 else torch.float16)


# -- the backend's registration: refusals by name, and "auto" -------------------------------


def _qkv(dtype=torch.float32, d=16, device="cpu"):
    return tuple(torch.randn(1, 2, 17, d, dtype=dtype, device=device) for _ in range(3))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"attn_mask": torch.ones(17, 17, dtype=torch.bool)}, "attn_mask"),
        ({"key_padding_mask": torch.zeros(1, 17, dtype=torch.bool)}, "key_padding_mask"),
        ({"dropout_p": 0.1, "dropout_mask": torch.ones(17, 17, dtype=torch.bool)},
         "dropout_mask"),
        ({"causal": True, "chunk_size": 4}, "chunk_size"),
    ],
    ids=["attn_mask", "key_padding_mask", "dropout_mask", "chunk_size"],
)  # fmt: skip
def test_what_the_kernel_cannot_take_is_refused_by_name(options, named, device):
    with pytest.raises(ValueError, match=f"backend='triton' cannot compute this call: .*{named}"):
        attention(*_qkv(device=device), backend="triton", **options)


@pytest.mark.parametrize(
    ("dtype", "d", "named"),
    [(torch.float64, 16, "torch.float64"), (torch.float32, 257, "head widths D = 257")],
)
def test_dtypes_and_head_widths_beyond_the_limits_are_refused(dtype, d, named, device):
    with pytest.raises(ValueError, match=f"cannot compute this call: {named}"):
        attention(*_qkv(dtype, d, device), backend="triton")


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(launch, "interpreted", lambda: False)

    with pytest.raises(ValueError, match="CPU tensors .*TRITON_INTERPRET=1"):
        attention(*_qkv(), backend="triton")


@pytest.mark.skipif(not launch.interpreted(), reason="bfloat16 runs on a GPU")
def test_bfloat16_is_refused_under_the_interpreter():
    with pytest.raises(ValueError, match="bfloat16 under Triton's interpreter"):
        attention(*_qkv(torch.bfloat16), backend="triton")


def test_auto_picks_the_kernel_on_cuda_for_what_sdpa_refuses_and_never_on_cpu():
    q = torch.randn(1, 2, 17, 16, requires_grad=True)

    def call(device: str, **options: Any) -> backends.Call:
        rules = prepare(q, q, q, **options).rules
        return backends.Call(rules, False, torch.float16, torch.device(device), True, (16, 16))

    assert backends.choose(call("cuda", softcap=2.0)) == "triton"
    assert backends.choose(call("cuda", causal=True)) == "sdpa"
    assert backends.choose(call("cpu", softcap=2.0)) == "manual"
