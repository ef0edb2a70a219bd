"""The measured errors of the converted Hugging Face layers, as a table (an opt-in measurement,
not a test).

    python -m tests.parity.hf_errors      # from the repository root; about a minute
    python -m tests.parity.hf_errors lfm3 laguna   # only the cases whose names start so

For every case of ``test_hf_models.CASES``: the relative error (``parity_tests.tolerances.
rel_error``, each tensor on its own scale) of the NumPy layer and of its torch twin against
transformers' own attention module in float64, worst over the batches the test runs (left-padded,
and unpadded where the case has it): out (on the real tokens), dx, the worst parameter gradient
(by the model's names; a KV-shared layer's shared keys and values among them), and decode (the
worst step of a prefill and five decode steps with ``DynamicCache``). docs/hugging-face.md
("Errors against transformers") records a run; the tests hold the same comparisons to
FLOAT64_RTOL.
"""

from __future__ import annotations

import sys

import numpy as np

from numpy_attention.hf import padding_from_hf
from parity_tests.tolerances import rel_error

from ..conftest import SEED, to_numpy, to_torch
from . import test_hf_models as hf

PACKAGES = ("numpy", "torch")


def forward_errors(case, padded, rng):
    """package -> {"out", "dx", "parameters"}: the errors of one forward and backward."""
    config, model = case.build()
    embeds, attention_mask, positions = hf.inputs(rng, padded, config.get_text_config().hidden_size)
    args, kwargs, _ = hf.record_attention_call(
        model,
        case.layer_idx,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        position_ids=positions,
    )
    attention = hf.attention_of(model, case.layer_idx)
    layers = hf.convert_layers(case, config, model)
    padding, ours = padding_from_hf(attention_mask)
    real = attention_mask.numpy() == 1
    x = rng.standard_normal((hf.B, hf.N, hf.input_width(config)))
    dout = rng.standard_normal((hf.B, hf.N, config.get_text_config().hidden_size)) * real[..., None]
    shared_kv, kv_t = None, []
    if layers["numpy"].kv_shared:  # as the test: keys and values of its own, as leaves
        shape = (2, hf.B, layers["numpy"].num_kv_heads, hf.N, layers["numpy"].head_dim)
        shared_kv = rng.standard_normal(shape)
        kv_t = [to_torch(t, requires_grad=True) for t in shared_kv]
        kind = config.get_text_config().layer_types[case.layer_idx]
        kwargs = kwargs | {"shared_kv_states": hf.KVSharingDict({kind: tuple(kv_t)})}
    x_t = to_torch(x, requires_grad=True)
    expected = hf.call_attention(attention, args, kwargs, x_t)
    expected.backward(to_torch(dout))
    errors = {}
    for package, layer in layers.items():
        out, dx, grads, dkv = hf.forward_backward(layer, x, dout, ours, padding, shared_kv)
        grads = hf.model_gradients(config, attention, case.layer_idx, grads)
        errors[package] = {
            "out": rel_error(out[real], to_numpy(expected)[real]),
            "dx": rel_error(dx, to_numpy(x_t.grad)),
            "parameters": max(
                [
                    rel_error(grads[name], to_numpy(param.grad))
                    for name, param in attention.named_parameters()
                    if param.grad is not None  # Zamba2: the block's other layers' adapters
                ]
                + [rel_error(d, to_numpy(t.grad)) for d, t in zip(dkv or [], kv_t, strict=False)]
            ),
        }
    return errors


def decode_errors(case, rng):
    """package -> the worst step's error of the decode test's run."""
    config, model = case.build()
    embeds, attention_mask, positions = hf.inputs(rng, True, config.get_text_config().hidden_size)
    layers = hf.convert_layers(case, config, model)
    source_idx = hf.kv_source_layer(config.to_dict(), case.layer_idx)
    recorded = (case.layer_idx,) if source_idx is None else (case.layer_idx, source_idx)
    sources = {}
    if source_idx is not None:  # as the test: the source fills the cache the layer reads
        sources = hf.convert_layers(
            hf.dataclasses.replace(case, layer_idx=source_idx), config, model
        )
    hf_cache = hf.DynamicCache(config=config)
    caches = {package: hf.new_cache(layer) for package, layer in (sources or layers).items()}
    real = attention_mask.numpy() == 1
    worst = dict.fromkeys(PACKAGES, 0.0)
    for start, stop in [(0, hf.PREFILL)] + [(i, i + 1) for i in range(hf.PREFILL, hf.N)]:
        calls = hf.record_attention_calls(
            model,
            recorded,
            inputs_embeds=embeds[:, start:stop],
            attention_mask=attention_mask[:, :stop],
            position_ids=positions[:, start:stop],
            past_key_values=hf_cache,
            use_cache=True,
        )
        args, kwargs, expected = calls[case.layer_idx]
        padding, ours = padding_from_hf(attention_mask[:, :stop], stop - start)
        x = to_numpy(hf.attention_input(args, kwargs))
        rows = real[:, start:stop]
        for package, layer in layers.items():
            if source_idx is not None:
                source_x = to_numpy(hf.attention_input(*calls[source_idx][:2]))
                hf.decode_step(sources[package], source_x, ours, padding, caches[package])
            out = hf.decode_step(layer, x, ours, padding, caches[package])
            error = rel_error(out[rows], to_numpy(expected)[rows])
            worst[package] = max(worst[package], error)
    return worst


def main(prefixes: list[str]) -> None:
    print("| case | package | out | dx | parameters | decode |")
    print("|---|---|---|---|---|---|")
    for case in hf.CASES:
        if prefixes and not case.name.startswith(tuple(prefixes)):
            continue
        rng = np.random.default_rng(SEED)
        runs = [
            forward_errors(case, padded, rng)
            for padded in ((False, True) if case.unpadded else (True,))
        ]
        decode = decode_errors(case, rng)
        cells = [
            " / ".join(f"{max(run[p][key] for run in runs):.1e}" for p in PACKAGES)
            for key in ("out", "dx", "parameters")
        ]
        cells.append(" / ".join(f"{decode[p]:.1e}" for p in PACKAGES))
        print(f"| {case.name} | NumPy / torch | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    from .conftest import transformers_torch_paths

    with transformers_torch_paths():
        main(sys.argv[1:])
