"""parity_tests/bench/gpt2.py at a tiny layer: the NumPy layer and its torch mirror agree, every
stage is timed, and the report's lines name the layer's shape."""

from __future__ import annotations

from parity_tests.bench import gpt2
from parity_tests.tolerances import FLOAT32_RTOL

STAGES = ("Wqkv", "attention", "merge", "Wo")


def test_the_layer_and_its_stages_are_timed_on_both_sides(monkeypatch):
    monkeypatch.setattr(gpt2, "GPT2", {"batch": 2, "tokens": 7, "width": 16, "heads": 2})

    result = gpt2.gpt2_layer(1)

    assert result["rel error"] <= FLOAT32_RTOL  # the same weights on both sides
    timed = ["numpy", "torch"] + [
        f"{side} {stage}" for side in ("numpy", "torch") for stage in STAGES
    ]
    assert all(result[name] > 0 for name in timed) and result["numpy peak"] > 0
    lines = gpt2.layer_lines(result)
    assert lines[0] == "### GPT-2 attention layer forward, x (2, 7, 16), 2 heads, eval, no_grad"
    assert sum(line.startswith("| ") for line in lines) == 1 + len(STAGES)  # header, stages
