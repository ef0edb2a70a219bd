"""parity_tests/bench/tuning.py, the ``profile`` part, through ``python -m parity_tests.bench`` at
a small shape: the tiled path's products alone, set against the whole and against SDPA, and the
forward's time over its products with each of its other steps."""

from __future__ import annotations

from parity_tests.bench import cli, measure, tuning

from .conftest import RECORDED


def test_the_profile_sets_the_products_alone_against_sdpa(doc, monkeypatch, capsys):
    monkeypatch.setattr(measure, "matmul_rate", lambda repeats: 100.0)
    monkeypatch.setattr(tuning, "PROFILE", (1, 2, 512, 16))
    assert cli.main(["--only", "profile", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    forward, both = (line for line in lines if "the products alone" in line)
    assert forward.startswith("- forward: the products alone, 2 per tile for 3 tiles")
    assert both.startswith("- forward+backward: the products alone, 7 per tile for 3 tiles")
    assert "x torch SDPA's whole forward (" in forward and "at 1.0x SDPA" in forward
    assert "at 0.9x SDPA" in both
    ratio = next(line for line in lines if line.startswith("The tiled forward takes"))
    assert "x the time of its own products (target: within 1.4x)" in ratio
    rows = []
    for line in lines[lines.index(ratio) + 4 :]:
        if not line.startswith("| "):
            break
        rows.append(line)
    steps = [row.split(" | ")[0].removeprefix("| ") for row in rows]
    assert steps == [
        "the products (2 per tile)",
        "exp",
        "shift and masks (scores.apply)",
        "row sums (ones @ P)",
        "acc += P V",
        "before the tiles (checks, score bounds)",
        "the rest: Python, tile setup and finish, pool hand-offs",
    ]
    assert doc.read_text() == RECORDED


def test_the_forward_breakdown_leaves_the_rest_to_python_and_the_pool():
    """Whole 10 ms over products 4 ms: 2.50x; the rest is what neither the products nor the
    steps timed alone account for, 10 - 4 - 3 - 1 = 2 ms."""
    floor = {
        "tiled fwd": 0.010,
        "forward products": 0.004,
        "forward steps": {"exp": 0.003, "row sums (ones @ P)": 0.001},
    }

    lines = tuning.forward_breakdown_lines(floor)

    assert lines[0].startswith("The tiled forward takes 2.50x the time of its own products")
    assert lines[4:8] == [
        "| the products (2 per tile) | 4.0 ms | 40% | 1.00 |",
        "| exp | 3.0 ms | 30% | 0.75 |",
        "| row sums (ones @ P) | 1.0 ms | 10% | 0.25 |",
        "| the rest: Python, tile setup and finish, pool hand-offs | 2.0 ms | 20% | 0.50 |",
    ]


def test_each_forward_step_is_timed_over_the_forwards_tiles():
    times = tuning.forward_breakdown((1, 2, 300, 16), 2, products=lambda: None)

    assert list(times) == [
        "the products (2 per tile)",
        "the whole forward",
        "exp",
        "shift and masks (scores.apply)",
        "row sums (ones @ P)",
        "acc += P V",
        "before the tiles (checks, score bounds)",
    ]
    assert all(seconds > 0 for name, seconds in times.items() if "products" not in name)
