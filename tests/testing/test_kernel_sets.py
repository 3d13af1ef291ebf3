"""Which errors count as a kernel set torch cannot run on this CPU (a skip), and which stay failures."""

from __future__ import annotations

import pytest
import torch

from specverify.testing.kernel_sets import is_kernel_set_limitation, kernel_set_limitation

AMX_REFUSAL = RuntimeError("pack_vnni2 is only supported when avx512 is supported")


def test_a_refused_kernel_is_a_limitation_only_under_a_forced_kernel_set(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert is_kernel_set_limitation(AMX_REFUSAL)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert not is_kernel_set_limitation(AMX_REFUSAL)


@pytest.mark.parametrize("error", [RuntimeError("shape mismatch"), ValueError("only supported when avx512 is on"),
                                   RuntimeError("expected scalar type BFloat16")])
def test_other_errors_are_never_limitations(monkeypatch, error):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert not is_kernel_set_limitation(error)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_probe_runs_under_torchs_own_kernel_set(dtype):
    """With the kernels torch picked itself every path runs: the probe finds nothing."""
    assert kernel_set_limitation(dtype) is None


def test_the_probe_reports_a_refusal_and_raises_anything_else(monkeypatch):
    def refuse(*args, **kwargs):
        raise AMX_REFUSAL

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refuse)
    assert kernel_set_limitation(torch.bfloat16) == str(AMX_REFUSAL)

    def broken(*args, **kwargs):
        raise RuntimeError("a real bug")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", broken)
    with pytest.raises(RuntimeError, match="a real bug"):
        kernel_set_limitation(torch.bfloat16)
