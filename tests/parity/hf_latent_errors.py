"""The errors of the latent layer against transformers, measured (opt-in, not a test):

    python -m tests.parity.hf_latent_errors

prints, for every case of test_hf_latent.py, the largest relative error (each tensor on its own
scale, ``parity_tests.tolerances.rel_error``) of the output on the real tokens, dx and every
parameter's gradient, for the NumPy layer and the torch twin in both forms, the decoding steps
against ``DynamicCache`` with ``absorb=None`` and the caches' contents, and the absorbed form
against the expanded one in NumPy: the same computations as the tests, measured instead of
asserted (a DSA layer's cache: its indexer keys too). docs/hugging-face.md records a run.
"""

from __future__ import annotations

import numpy as np

from parity_tests.tolerances import rel_error

from .test_hf_latent import CASES, convert_layer, hf_decode, hf_forward, new_cache, run_layer

PACKAGES = ("numpy", "torch")
FORMS = {"expanded": False, "absorbed": True}


def gradient_errors(name: str) -> tuple[dict, float]:
    """{(package, form): (out, dx, worst parameter)} and the NumPy forms' largest difference."""
    case = next(case for case in CASES if case.name == name)
    expected = hf_forward(name)
    errors, runs = {}, {}
    for package in PACKAGES:
        for form, absorb in FORMS.items():
            layer = convert_layer(case, package)
            out, dx, grads = run_layer(
                layer, expected.x, dout=expected.dout, absorb=absorb, **expected.forward
            )
            runs[package, form] = out, dx, grads
            errors[package, form] = (
                rel_error(out[expected.real], expected.out[expected.real]),
                rel_error(dx, expected.dx),
                max(rel_error(grads[key], grad) for key, grad in expected.grads.items()),
            )
    (out_e, dx_e, grads_e), (out_a, dx_a, grads_a) = (
        runs["numpy", "expanded"],
        runs["numpy", "absorbed"],
    )
    forms = max(
        [rel_error(out_a, out_e), rel_error(dx_a, dx_e)]
        + [rel_error(grads_a[key], grad) for key, grad in grads_e.items()]
    )
    return errors, forms


def decode_errors(name: str, package: str) -> tuple[float, float]:
    """The worst decoding step and the worst of the two caches' contents, ``absorb=None``."""
    case = next(case for case in CASES if case.name == name)
    steps, real, c_kv, k_pe, index_keys = hf_decode(name)
    layer = convert_layer(case, package)
    cache = new_cache(package, layer)
    worst = max(
        rel_error(run_layer(layer, x, cache=cache, **forward)[rows], expected[rows])
        for x, expected, forward, rows in steps
    )
    contents = max(
        rel_error(np.asarray(cache.c_kv)[real], c_kv[:, 0][real]),
        rel_error(np.asarray(cache.k_rope)[real], k_pe[:, 0][real]),
        0.0
        if index_keys is None
        else rel_error(np.asarray(cache.index_keys)[real], index_keys[real]),
    )
    return worst, contents


def main() -> None:
    print("| case | form | out (NumPy / torch) | dx | parameters | decode, absorb=None | cache |")
    print("|---|---|---|---|---|---|---|")
    agreement = []
    for case in CASES:
        errors, forms = gradient_errors(case.name)
        decode = {package: decode_errors(case.name, package) for package in PACKAGES}
        agreement.append((case.name, forms))
        for form in FORMS:
            cells = [" / ".join(f"{errors[p, form][i]:.1e}" for p in PACKAGES) for i in range(3)]
            steps = " / ".join(f"{decode[p][0]:.1e}" for p in PACKAGES)
            cache = " / ".join(f"{decode[p][1]:.1e}" for p in PACKAGES)
            tail = f"{steps} | {cache}" if form == "expanded" else "(above) | (above)"
            print(f"| {case.name} | {form} | {' | '.join(cells)} | {tail} |")
    print()
    print("| case | absorbed vs expanded, NumPy (out, dx, every parameter) |")
    print("|---|---|")
    for name, forms in agreement:
        print(f"| {name} | {forms:.1e} |")


if __name__ == "__main__":
    from .conftest import transformers_torch_paths

    with transformers_torch_paths():
        main()
