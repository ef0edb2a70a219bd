"""Triton's interpreter and bfloat16: a Triton kernel (its module or its package imports Triton)
checked with ``TRITON_INTERPRET=1`` skips bfloat16 with one warning, its groups "skip" with the
reason; any other kernel, or any kernel without the interpreter, runs bfloat16 as always."""

from __future__ import annotations

import functools
import importlib
import sys
import textwrap

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.running.interpreter import (
    INTERPRETER_BFLOAT16,
    InterpreterWarning,
    interpreter_skips,
    triton_code,
)

# A module that imports Triton, as far as names go (the test runs where Triton is not
# installed too): its namespace holds a module called "triton".
TRITON_KERNEL = """
    import types

    import torch.nn.functional as F

    triton = types.ModuleType("triton")


    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                              scale=scale)
"""
ADAPTER = """
    import torch.nn.functional as F


    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                              scale=scale)
"""


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write modules (name -> source) under tmp_path and import them; forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    imported: list[str] = []

    def make(sources: dict[str, str]):
        for name, source in sources.items():
            path = tmp_path.joinpath(*name.split("."))
            if name.endswith("__init__"):
                path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".py").write_text(textwrap.dedent(source))
        names = [name.removesuffix(".__init__") for name in sources]
        imported.extend(names)
        return [importlib.import_module(name) for name in names]

    yield make
    for name in imported:
        sys.modules.pop(name, None)


def test_a_kernel_whose_module_imports_triton_is_triton_code(modules):
    (module,) = modules({"triton_kernel_a": TRITON_KERNEL})

    assert triton_code(module.attention)
    assert triton_code(functools.partial(module.attention, scale=0.5))


def test_an_adapter_in_a_package_that_imports_triton_is_triton_code(modules):
    _, _, adapter, plain = modules({
        "fast_attention_b.__init__": "from . import kernels, adapter\n",
        "fast_attention_b.kernels": TRITON_KERNEL,
        "fast_attention_b.adapter": ADAPTER,
        "plain_b": ADAPTER,
    })  # fmt: skip

    assert triton_code(adapter.attention)
    assert not triton_code(plain.attention) and not triton_code(F.scaled_dot_product_attention)


@pytest.mark.parametrize(
    ("environ", "dtypes", "skipped"),
    [
        ({"TRITON_INTERPRET": "1"}, ("float32", "bfloat16"), {"bfloat16": INTERPRETER_BFLOAT16}),
        ({"TRITON_INTERPRET": "0"}, ("float32", "bfloat16"), {}),
        ({}, ("float32", "bfloat16"), {}),
        ({"TRITON_INTERPRET": "1"}, ("float32", "float16"), {}),
    ],
)
def test_bfloat16_is_skipped_under_the_interpreter_only(modules, environ, dtypes, skipped):
    (module,) = modules({"triton_kernel_c": TRITON_KERNEL})

    assert interpreter_skips(module.attention, dtypes, environ) == skipped


def test_check_kernel_warns_once_and_reports_the_bfloat16_groups_skipped(modules, monkeypatch):
    (module,) = modules({"triton_kernel_d": TRITON_KERNEL})
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    with pytest.warns(InterpreterWarning, match="bfloat16 skipped") as warned:
        report = check_kernel(module.attention, features=[], dtypes=["float32", "bfloat16"],
                              cases=["plain", "causal-n<m"])  # fmt: skip

    assert len(warned) == 1
    assert report.groups == {
        ("plain", "float32"): "pass",
        ("causal-n<m", "float32"): "not-run",  # a feature not claimed: not run, in any dtype
        ("plain", "bfloat16"): "skip",
        ("causal-n<m", "bfloat16"): "not-run",
    }
    (skip,) = [row for row in report.rows if row.verdict == "skip"]
    assert skip.detail == INTERPRETER_BFLOAT16


def test_a_kernel_that_is_not_triton_code_runs_bfloat16_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    report = check_kernel(F.scaled_dot_product_attention, dtypes=["bfloat16"], cases=["plain"])

    assert report.groups == {("plain", "bfloat16"): "pass"}
