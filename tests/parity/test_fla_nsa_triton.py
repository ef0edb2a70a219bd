"""flash-linear-attention's NSA Triton kernels (``fla.ops.nsa.parallel.parallel_nsa``, fla-core
0.6.0) under Triton's interpreter, judged against ``nsa_forward`` / ``nsa_backward``: the blocks
its ``parallel_nsa_topk`` selects, the output and every gradient (q, k, v and the gates).

The kernels run in one child process with ``TRITON_INTERPRET=1`` in its environment (Triton reads
it at its first import, which this process may have done already; docs/triton-on-cpu.md). There
each autotuned fla kernel keeps only its first configuration, which Triton's ``Autotuner`` then
launches without benchmarking; fla's own Python wrappers run unchanged. The sliding window calls
``flash_attn_func`` (CUDA), stood in as in test_fla_nsa.py by a dense causal-window attention.
Inputs go to the child and results come back as .npz files.

fla computes in the inputs' dtype (float32 here), the golden in float64 on the same values.

Opt-in, as every run of fla's Triton kernels: ``CHECK_FLA_TRITON=1 python -m pytest
tests/parity/test_fla_nsa_triton.py -n 0`` (about 1-2 minutes).

The finding (docs/derivations/nsa.md, "fla's Triton kernel"): with an int ``block_counts`` that
is not a power of two, fla selects and attends ``next_power_of_2(block_counts)`` blocks, and its
dk, dv count only the first ``block_counts`` of them: they are not the gradient of its output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numpy_attention.nsa import nsa_backward, nsa_forward

from ..conftest import SEED, assert_close

pytest.importorskip("triton")
pytest.importorskip("fla.ops.nsa.parallel", reason="needs the fla extra: pip install -e '.[fla]'")
# fla's NSA kernels take 1-2 minutes of the suite's two cores under the interpreter: opt-in, as
# every fla Triton run is (tests/checker/specs/test_linear.py)
pytestmark = pytest.mark.skipif(
    os.environ.get("CHECK_FLA_TRITON") != "1",
    reason="fla's Triton kernels under the interpreter are slow: CHECK_FLA_TRITON=1 runs them",
)

ROOT = Path(__file__).resolve().parents[2]
H, H_KV, D = 16, 1, 16  # fla's group size H / H_kv must be a power of two >= 16
PACKED = [0, 17, 40]
CASES = {
    # fla's own selection; block_size 8 puts 6 blocks in 45 tokens, so the top-k ranks some
    "fla_selects": dict(tokens=45, block_size=8, block_counts=4),
    # our selection given, per-token block counts (the kernels' USE_BLOCK_COUNTS path), two
    # sequences and the window
    "ours_given": dict(
        tokens=40,
        block_size=16,
        block_counts="per token",
        window_size=5,
        cu_seqlens=PACKED,
        given=True,
    ),
    # the finding: our 4 blocks given, fla told block_counts = 3
    "int_counts_3": dict(tokens=33, block_size=8, block_counts=4, given=True, fla_block_counts=3),
}
NAMES = ["q", "k", "v", "g_cmp", "g_slc", "g_swa"]


def make_case(
    rng, tokens, block_size, block_counts, window_size=0, cu_seqlens=None, given=False,
    fla_block_counts=None,
):  # fmt: skip
    """The inputs as float32 values, our float64 golden on them and the arrays the child needs
    (our blocks among them when ``given``; ``fla_block_counts`` in place of ``block_counts``)."""
    arrays = {
        "q": rng.standard_normal((tokens, H, D)),
        "k": rng.standard_normal((tokens, H_KV, D)),
        "v": rng.standard_normal((tokens, H_KV, D)),
        "g_cmp": rng.uniform(0.1, 1.0, (tokens, H)),
        "g_slc": rng.uniform(0.1, 1.0, (tokens, H)),
        "g_swa": rng.uniform(0.1, 1.0, (tokens, H)),
        "dout": rng.standard_normal((tokens, H, D)),
    }
    arrays = {name: a.astype(np.float32).astype(np.float64) for name, a in arrays.items()}
    if not window_size:
        del arrays["g_swa"]
    if block_counts == "per token":
        block_counts = rng.integers(1, 5, (tokens, H_KV))
    ref = nsa_forward(
        *(arrays[n] for n in NAMES if n in arrays), block_size=block_size,
        block_counts=block_counts, window_size=window_size,
        cu_seqlens=None if cu_seqlens is None else np.array(cu_seqlens),
    )  # fmt: skip
    if fla_block_counts is not None:
        block_counts = fla_block_counts
    child = dict(arrays, block_size=block_size, window_size=window_size, block_counts=block_counts)
    if cu_seqlens is not None:
        child["cu_seqlens"] = np.array(cu_seqlens)
    if given:
        child["block_indices"] = ref.block_indices
    return arrays, ref, child


def by_case(data) -> dict[str, dict[str, np.ndarray]]:
    """An .npz of "case.name" keys as {case: {name: array}}."""
    cases: dict[str, dict[str, np.ndarray]] = {}
    for key in data:
        case, name = key.split(".")
        cases.setdefault(case, {})[name] = data[key]
    return cases


def run_fla(inputs: str, outputs: str) -> None:
    """The child's side: every case of ``inputs`` through ``parallel_nsa`` and its backward.

    Writes ``out`` and ``d<name>`` per case, and ``chosen`` (the blocks ``parallel_nsa_topk``
    returned) where fla selected them.
    """
    import torch
    from fla.ops.nsa import parallel
    from triton.runtime.autotuner import Autotuner, KernelInterface

    from .test_fla_nsa import window_attention

    assert os.environ.get("TRITON_INTERPRET") == "1"
    for module in [m for name, m in sys.modules.items() if name.startswith("fla.")]:
        for kernel in vars(module).values():
            while isinstance(kernel, KernelInterface) and not isinstance(kernel, Autotuner):
                kernel = getattr(kernel, "fn", None)
            if isinstance(kernel, Autotuner):
                kernel.configs = kernel.configs[:1]
    parallel.flash_attn_func = parallel.flash_attn_varlen_func = window_attention
    chosen = []
    select = parallel.parallel_nsa_topk

    def recorded_select(*args, **kwargs):
        chosen.append(select(*args, **kwargs))
        return chosen[-1]

    parallel.parallel_nsa_topk = recorded_select
    results = {}
    with np.load(inputs) as data:
        for case, given in by_case(data).items():
            tensors = {
                n: torch.from_numpy(given[n][None]).float().requires_grad_()
                for n in NAMES
                if n in given
            }
            counts = given["block_counts"]
            chosen.clear()
            out = parallel.parallel_nsa(
                *tensors.values(), *([None] if "g_swa" not in tensors else []),
                block_indices=(
                    torch.from_numpy(given["block_indices"][None]).int()
                    if "block_indices" in given else None
                ),
                block_counts=int(counts) if counts.ndim == 0 else torch.from_numpy(counts[None]),
                block_size=int(given["block_size"]), window_size=int(given["window_size"]),
                cu_seqlens=torch.from_numpy(given["cu_seqlens"]) if "cu_seqlens" in given else None,
            )  # fmt: skip
            (out * torch.from_numpy(given["dout"][None]).float()).sum().backward()
            results[case + ".out"] = out[0].detach().double().numpy()
            for name, tensor in tensors.items():
                results[f"{case}.d{name}"] = tensor.grad[0].double().numpy()
            if chosen:
                results[case + ".chosen"] = chosen[0][0].numpy()
    np.savez(outputs, **results)


@pytest.fixture(scope="module")
def fla_runs(tmp_path_factory):
    """Each case: (inputs, our golden, fla's results), fla's from one interpreted child."""
    rng = np.random.default_rng(SEED)
    cases = {name: make_case(rng, **options) for name, options in CASES.items()}
    folder = tmp_path_factory.mktemp("fla_nsa_triton")
    inputs, outputs = folder / "inputs.npz", folder / "outputs.npz"
    np.savez(inputs, **{f"{case}.{k}": a for case, (*_, x) in cases.items() for k, a in x.items()})
    script = f"import sys; from {__name__} import run_fla; run_fla(*sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", script, str(inputs), str(outputs)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(outputs) as data:
        fla = by_case(data)
    return {case: (arrays, ref, fla[case]) for case, (arrays, ref, _) in cases.items()}


@pytest.mark.parametrize("case", ["fla_selects", "ours_given"])
def test_parallel_nsa_equals_nsa(fla_runs, case):
    arrays, ref, fla = fla_runs[case]
    grads = nsa_backward(arrays["dout"], ref.ctx)
    if not CASES[case].get("given"):
        assert np.array_equal(np.sort(fla["chosen"], -1), np.sort(ref.block_indices, -1))
    assert_close(fla["out"], ref.out, dtype=np.float32, name="out")
    for name in NAMES:
        if name in arrays:
            assert_close(fla["d" + name], getattr(grads, "d" + name), dtype=np.float32, name=name)


def test_int_block_counts_below_the_width(fla_runs):
    """block_indices of width 4 and block_counts = 3 (what fla's own selection hands its kernels
    for 3): the forward attends all 4 blocks (out, dq and the gates' gradients are ours with 4),
    while dk and dv count only the first 3 of each token's blocks."""
    arrays, ref, fla = fla_runs["int_counts_3"]
    grads = nsa_backward(arrays["dout"], ref.ctx)
    assert_close(fla["out"], ref.out, dtype=np.float32, name="out")
    for name in ["q", "g_cmp", "g_slc"]:
        assert_close(fla["d" + name], getattr(grads, "d" + name), dtype=np.float32, name=name)
    for name in ["k", "v"]:
        error = np.abs(fla["d" + name] - getattr(grads, "d" + name)).max()
        assert error > 1e-2 * np.abs(getattr(grads, "d" + name)).max(), name
