"""The built-in targets: each passes the default battery except where a failure is documented,
each documented failure really fails, and a forced backend that refuses a case skips it."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from parity_tests import KernelUnsupported, check_kernel
from parity_tests.checker import targets
from parity_tests.checker.targets import (
    EXPECTED_FAILURES,
    builtin_targets,
    expected_failure,
    forced_sdpa,
    mha_kernel,
)

DTYPES = ("float32", "float16", "bfloat16")


@pytest.mark.parametrize("name", [target.name for target in builtin_targets("cpu", DTYPES)])
def test_builtin_targets_fail_only_where_documented(name):
    target = next(t for t in builtin_targets("cpu", DTYPES) if t.name == name)

    report = check_kernel(target.kernel, dtypes=target.dtypes)

    unexpected = [
        row for row in report.failures if not expected_failure(name, row.case, row.dtype, "cpu")
    ]
    assert not unexpected
    statuses = list(report.groups.values())
    assert statuses.count("skip") < statuses.count("pass")


@pytest.mark.parametrize("entry", EXPECTED_FAILURES, ids=lambda e: f"{e.target}-{e.case}")
def test_expected_failures_really_fail(entry):
    target = next(t for t in builtin_targets("cpu", DTYPES) if t.name == entry.target)

    report = check_kernel(target.kernel, dtypes=entry.dtypes or DTYPES, cases=[entry.case])

    assert {row.verdict for row in report.rows} == {"nonfinite"}


def test_a_forced_backend_that_refuses_raises_kernel_unsupported_with_torchs_reason():
    q = torch.randn(1, 1, 4, 8)

    with pytest.raises(KernelUnsupported, match="dropout"):
        forced_sdpa(SDPBackend.FLASH_ATTENTION)(q, q, q, dropout_p=0.5)


def test_the_mha_adapter_refuses_dv_unlike_d():
    q, v = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 16)

    with pytest.raises(KernelUnsupported, match="Dv == D"):
        mha_kernel(need_weights=False)(q, q, v)


def _with_a_backend_that_refuses(real):
    def attention(*args, backend, **kwargs):
        if backend == "never":
            raise ValueError("backend='never' cannot compute this call: not on this device")
        if backend == "broken":
            raise ValueError("a real bug")
        return real(*args, backend=backend, **kwargs)

    return attention


def test_a_torch_attention_backend_that_refuses_a_call_skips_it(monkeypatch):
    monkeypatch.setattr(targets, "attention", _with_a_backend_that_refuses(targets.attention))
    q = torch.randn(1, 1, 4, 8)

    with pytest.raises(KernelUnsupported, match="not on this device"):
        targets.torch_attention_kernel("never")(q, q, q)
    with pytest.raises(ValueError, match="a real bug"):
        targets.torch_attention_kernel("broken")(q, q, q)


def test_a_backend_that_cannot_run_on_the_device_is_left_out(monkeypatch):
    monkeypatch.setattr(targets, "attention", _with_a_backend_that_refuses(targets.attention))
    monkeypatch.setattr(targets, "BACKENDS", ("math", "never"))

    names = [target.name for target in builtin_targets("cpu", DTYPES)]

    assert "torch_attention[math]" in names and "torch_attention[never]" not in names
