"""Every spec is a plugin the pipeline finds by its module, and the one battery builder gives each
of them, for every claim, a battery in which every pair of the claimed features' values meets in
a judged case and every size requirement is met (decode specs included); the hooks a spec must
implement are abstract."""

from __future__ import annotations

import pytest

from parity_tests.checker import specs
from parity_tests.checker.battery import pairs
from parity_tests.checker.battery.catalog import select, size_coverage
from parity_tests.checker.spec import Spec


def _claims() -> list:
    """Per spec: every feature, each feature alone, and all but each one."""
    found = []
    for spec in specs.registry().values():
        found.append(pytest.param(spec.name, None, id=f"{spec.name}-all"))
        for feature in sorted(spec.feature_factors):
            found.append(pytest.param(spec.name, frozenset({feature}), id=f"{spec.name}-{feature}"))
            rest = spec.features - {feature}
            found.append(pytest.param(spec.name, rest, id=f"{spec.name}-all-but-{feature}"))
    return found


def test_the_registry_finds_every_spec_module_by_its_name():
    assert specs.SPECS == (
        "sdpa", "flash", "flash_varlen", "flex", "ring", "flash_kvcache", "flash_mla", "sparse",
        "flash_mla_sparse", "fla_gdn", "fla_kda", "flashinfer_paged", "flashinfer_merge",
        "vllm_paged",
    )  # fmt: skip
    assert all(isinstance(spec, Spec) for spec in specs.registry().values())
    opt_in = {feature for spec in specs.registry().values() for feature in spec.opt_in}
    assert set(specs.FEATURES) == set().union(*specs.SPEC_FEATURES.values(), opt_in)


def test_deterministic_is_claimed_explicitly_by_the_attention_specs_only():
    claimable = {name for name, spec in specs.registry().items() if "deterministic" in spec.opt_in}

    assert claimable == {"sdpa", "flash", "flash_varlen", "flex", "ring"}
    assert not any("deterministic" in spec.features for spec in specs.registry().values())
    assert specs.resolve_features("sdpa", None) == specs.SPEC_FEATURES["sdpa"]  # not claimed
    assert "deterministic" in specs.resolve_features("flash", {"causal", "deterministic"})
    with pytest.raises(ValueError, match="cannot express"):
        specs.resolve_features("flash_kvcache", {"deterministic"})


@pytest.mark.parametrize(("name", "claimed"), _claims())
def test_every_claim_gets_every_pair_and_size_of_what_it_claims(name, claimed):
    spec = specs.get(name)
    key = spec.features if claimed is None else claimed

    judged = [case for case in select(spec, None, claimed) if case.needs <= key]

    assert judged and not pairs.uncovered(spec, judged, claimed)
    met = size_coverage(spec, judged, claimed)
    assert all(met.values()), [label for label, ok in met.items() if not ok]


def test_a_spec_that_leaves_out_a_hook_cannot_be_made():
    class Half(Spec):
        name = "half"
        signature = "half(q)"
        features = frozenset()

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_an_unknown_spec_is_refused_by_name():
    with pytest.raises(ValueError, match="spec must be one of"):
        specs.get("xformers")
