"""The errors of the latent layer against transformers, measured (opt-in, not a test):

    python -m tests.parity.hf_latent_errors

prints, for every case of test_hf_latent.py, the largest relative error (each tensor on its own
scale, ``parity_tests.tolerances.rel_error``) of the output on the real tokens, dx and every
parameter's gradient, for the NumPy layer in both forms and the torch twin in both, the decoding
steps against ``DynamicCache`` with ``absorb=None`` and the caches' contents, and the absorbed
form against the expanded one in NumPy. docs/hugging-face.md records a run.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from numpy_attention.hf import padding_from_hf
from numpy_attention.latent import LatentCache, deinterleave
from parity_tests.tolerances import rel_error
from torch_attention import LatentCache as TorchLatentCache

from ..conftest import SEED, to_numpy, to_torch
from .test_hf_latent import (
    CASES,
    PREFILL,
    B,
    C,
    L,
    N,
    R,
    attention_of,
    built,
    convert_layer,
    float64_math,
    inputs,
    record_attention_call,
    run_layer,
)


def gradient_errors(case, rng):
    """{(package, form): (out, dx, worst parameter)} and the NumPy forms' largest difference."""
    _, model, _ = built(case.name)
    embeds, attention_mask, positions = inputs(rng)
    attention = attention_of(case, model)
    kwargs, _ = record_attention_call(
        model, attention, inputs_embeds=embeds, attention_mask=attention_mask,
        position_ids=positions, use_cache=False,
    )  # fmt: skip
    padding, ours = padding_from_hf(attention_mask)
    real = attention_mask.numpy() == 1
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal(x.shape) * real[..., None]
    x_t = to_torch(x, requires_grad=True)
    call = {key: kwargs[key] for key in ("position_embeddings", "attention_mask", "position_ids")
            if key in kwargs}  # fmt: skip
    attention.zero_grad()
    with float64_math():
        expected = attention(hidden_states=x_t, **call)[0]
    expected.backward(to_torch(dout))
    hf_grads = {name: to_numpy(param.grad) for name, param in attention.named_parameters()}

    errors, runs = {}, {}
    for package in ("numpy", "torch"):
        layer = convert_layer(case, package)
        for form, absorb in (("expanded", False), ("absorbed", True)):
            if package == "numpy":
                layer.zero_grad()
            forward = {"positions": ours, "key_padding_mask": padding, "absorb": absorb}
            out, dx, grads = run_layer(layer, x, dout=dout, **forward)
            if package == "torch":
                layer.zero_grad()
            grads = {name: np.array(grad) for name, grad in grads.items()}
            runs[package, form] = (out, dx, grads)
            errors[package, form] = (
                rel_error(out[real], to_numpy(expected)[real]),
                rel_error(dx, to_numpy(x_t.grad)),
                max(rel_error(grads[name], grad) for name, grad in hf_grads.items()),
            )
    (out_e, dx_e, grads_e), (out_a, dx_a, grads_a) = (
        runs["numpy", "expanded"],
        runs["numpy", "absorbed"],
    )
    forms = max(
        [rel_error(out_a, out_e), rel_error(dx_a, dx_e)]
        + [rel_error(grads_a[name], grad) for name, grad in grads_e.items()]
    )
    return errors, forms


def decode_errors(case, rng, package):
    """The worst decoding step and the worst of the two caches' contents, ``absorb=None``."""
    _, model, _ = built(case.name)
    embeds, attention_mask, positions = inputs(rng)
    attention = attention_of(case, model)
    layer = convert_layer(case, package)
    hf_cache = DynamicCache(config=model.config)
    if package == "torch":
        cache = TorchLatentCache(B, N, L, R, torch.float64)
    else:
        cache = LatentCache(B, N, L, R, np.float64)
    real = attention_mask.numpy() == 1
    steps = []
    for start, stop in [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, N)]:
        kwargs, expected = record_attention_call(
            model, attention, inputs_embeds=embeds[:, start:stop],
            attention_mask=attention_mask[:, :stop], position_ids=positions[:, start:stop],
            past_key_values=hf_cache, use_cache=True,
        )  # fmt: skip
        padding, ours = padding_from_hf(attention_mask[:, :stop], stop - start)
        out = run_layer(layer, to_numpy(kwargs["hidden_states"]), cache=cache, positions=ours,
                        key_padding_mask=padding)  # fmt: skip
        rows = real[:, start:stop]
        steps.append(rel_error(out[rows], to_numpy(expected)[rows]))
    hf_layer = hf_cache.layers[attention.layer_idx]
    k_pe = to_numpy(hf_layer.values)
    if case.model == "DeepseekV2":
        k_pe = deinterleave(k_pe)
    contents = max(
        rel_error(np.asarray(cache.c_kv)[real], to_numpy(hf_layer.keys)[:, 0][real]),
        rel_error(np.asarray(cache.k_rope)[real], k_pe[:, 0][real]),
    )
    return max(steps), contents


def main() -> None:
    print("| case | form | out (NumPy / torch) | dx | parameters | decode, absorb=None | cache |")
    print("|---|---|---|---|---|---|---|")
    agreement = []
    for case in CASES:
        rng = np.random.default_rng(SEED)
        errors, forms = gradient_errors(case, rng)
        decode = {package: decode_errors(case, rng, package) for package in ("numpy", "torch")}
        agreement.append((case.name, forms))
        for form in ("expanded", "absorbed"):
            cells = [
                " / ".join(f"{errors[package, form][i]:.1e}" for package in ("numpy", "torch"))
                for i in range(3)
            ]
            steps = " / ".join(f"{decode[package][0]:.1e}" for package in ("numpy", "torch"))
            cache = " / ".join(f"{decode[package][1]:.1e}" for package in ("numpy", "torch"))
            tail = f"{steps} | {cache}" if form == "expanded" else "(above) | (above)"
            print(f"| {case.name} | {form} | {' | '.join(cells)} | {tail} |")
    print()
    print("| case | absorbed vs expanded, NumPy (out, dx, every parameter) |")
    print("|---|---|")
    for name, forms in agreement:
        print(f"| {name} | {forms:.1e} |")


if __name__ == "__main__":
    main()
