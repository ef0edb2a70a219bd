"""The decode contract's pure-Python checker (numpy_attention.decode.arguments), on its own: it
imports neither NumPy nor torch (so that both twins can call it), it plans a call from shapes and
integer lists (each sequence's pages, the first key any of its queries sees), and it refuses what
the contract refuses with the message both twins give (the twins' own cases:
test_checks.py here and tests/torch_attention/decode/test_checks.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from numpy_attention.decode import arguments
from numpy_attention.decode.arguments import Integers, plan_call


def ints(values, shape):
    return Integers("int32", True, shape, values)


def call(**changes):
    """Three sequences of 2 queries and 1 new token over a pool of 6 pages of 4 tokens."""
    given = {
        "q": (3, 2, 4, 8),
        "k_cache": (6, 4, 2, 8),
        "v_cache": (6, 4, 2, 8),
        "k": (3, 1, 2, 8),
        "v": (3, 1, 2, 8),
        "rotary_cos": None,
        "rotary_sin": None,
        "cache_seqlens": ints([0, 3, 5], (3,)),
        "cache_batch_idx": None,
        "cache_leftpad": None,
        "block_table": ints([[0, 1], [2, 3], [4, 5]], (3, 2)),
        "softmax_scale": None,
        "causal": True,
        "window_size": (-1, -1),
        "softcap": 0.0,
        "alibi_slopes": None,
        "alibi_finite": True,
    }
    return {**given, **changes}


def test_it_imports_only_the_standard_library():
    tree = ast.parse(Path(arguments.__file__).read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0] for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }  # fmt: skip

    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_a_plan_holds_each_sequences_pages_lengths_and_first_visible_key():
    plan = plan_call(**call(window_size=(2, -1)))

    assert plan.pages == [[0, 1], [2, 3], [4, 5]]
    assert (plan.seqlens, plan.s_new) == ([0, 3, 5], 1)
    assert plan.lo == [0, 0, 2]  # L_b - s_q - left, where the first query's window starts
    assert plan.q_moves  # causal: query i turns at its own position
    assert plan.options["window"] == (2, None) and plan.options["scale"] == pytest.approx(8**-0.5)


def test_a_contiguous_cache_is_one_page_per_row_and_one_length_serves_every_sequence():
    plan = plan_call(
        **call(
            block_table=None,
            k_cache=(4, 8, 2, 8),
            v_cache=(4, 8, 2, 8),
            cache_batch_idx=ints([3, 0, 1], (3,)),
            cache_seqlens=ints(2, ()),
        )
    )

    assert plan.pages == [[3], [0], [1]] and plan.seqlens == [2, 2, 2]


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"v": None}, ValueError, "k and v are appended together"),
        ({"q": (3, 2, 8)}, ValueError, r"q must have 4 axes, got shape \(3, 2, 8\)"),
        ({"cache_seqlens": ints([0, 8, 5], (3,))}, ValueError,
         r"sequence 1: cache_seqlens 8 \+ 1 new tokens = 9 keys, but its block table holds 8"),
        ({"block_table": Integers("float32", False, (3, 2), None)}, TypeError,
         "block_table must be an integer array, got dtype float32"),
        ({"block_table": ints([[0, 1], [2, 3], [4, 6]], (3, 2))}, ValueError,
         r"sequence 2: block_table\[2, 1\] = 6 is not one of the cache's 6 pages"),
        ({"window_size": (0, True)}, TypeError, r"window_size\[1\] must be an int"),
        ({"softcap": float("nan")}, ValueError, "softcap must be finite"),
        ({"alibi_slopes": (4,), "alibi_finite": False}, ValueError, "alibi_slopes must be finite"),
        ({"rotary_cos": (8, 4), "rotary_sin": (8, 4), "k": None, "v": None}, ValueError,
         "rotary embeds the new keys"),
    ],
    ids=["k without v", "rank", "capacity", "float table", "page", "window", "softcap", "alibi",
         "rotary without k"],
)  # fmt: skip
def test_each_refusal_names_the_argument(changes, error, match):
    with pytest.raises(error, match=match):
        plan_call(**call(**changes))
