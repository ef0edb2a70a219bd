"""docs/hugging-face.md's table of every model type is what tests/docs/hf_table.py generates from
the parity cases and the refusals (``python -m tests.docs.hf_table`` rewrites it), and no model
type in scope is left without a reason."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from . import hf_table  # noqa: E402


def test_the_committed_table_is_the_generated_one():
    committed = hf_table.section(hf_table.DOC.read_text())

    assert committed == "\n".join(hf_table.rows()), "run: python -m tests.docs.hf_table"


def test_every_model_type_in_scope_is_exact_or_refused_by_name():
    assert not [line for line in hf_table.rows() if "| no reason yet |" in line]


def test_the_docs_count_the_model_types_grouped_from_hf_loads():
    """README.md, docs/hugging-face.md and hf/grouped.py's docstring say how many model types the
    grouped converter loads: its rows and the multimodal wrappers read through them."""
    from numpy_attention.hf import grouped
    from numpy_attention.hf.families import FAMILIES, WRAPPERS

    count = len(FAMILIES) + len(WRAPPERS)
    readme = (hf_table.DOC.parents[1] / "README.md").read_text()

    assert f"({count} Hugging Face model types" in readme
    assert f"({count} model types of transformers 5.23" in readme
    assert f"({count} model types of transformers 5.23" in hf_table.DOC.read_text()
    assert f"{count} model types" in " ".join((grouped.__doc__ or "").split())
