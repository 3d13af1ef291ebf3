"""``specverify doctor``: every row says what it enables, a missing one how to fix it; fast, no torch import."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from specverify.cli import main
from specverify.cli.doctor import VLLM_CPU_VENV, rows, torch_kernel_set, vllm_cpu_venv_row

ROOT = Path(__file__).resolve().parents[2]


def test_doctor_lists_every_capability_with_what_it_enables_and_exits_0(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in (
        "torch",
        "CUDA",
        "C kernel",
        "transformers + gguf",
        "SmolLM2 GGUF",
        "llama-cpp-python",
        "vllm",
        "sglang",
        "lmdeploy",
        "vLLM CPU venv",
        "httpx",
    ):
        assert f"] {name}: " in out, name
    assert out.count("enables: ") == len(rows())
    assert "pytest -m gpu" in out and "pytest -m server" in out and "pytest -m engines" in out
    assert out.splitlines()[-1].startswith("missing: ")


def test_a_missing_row_names_the_command_that_fixes_it(tmp_path):
    row = vllm_cpu_venv_row(tmp_path)
    assert not row.ok and "fix: " in "\n".join(row.lines()) and VLLM_CPU_VENV in row.fix


def test_a_vllm_cpu_venv_is_found_with_its_version(tmp_path):
    venv = tmp_path / VLLM_CPU_VENV
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "lib" / "python3.12" / "site-packages" / "vllm-0.9.1+cpu.dist-info").mkdir(parents=True)
    row = vllm_cpu_venv_row(tmp_path)
    assert row.ok and "vllm 0.9.1+cpu" in row.detail


def test_the_kernel_set_follows_the_cpu_flags_and_the_cap(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert torch_kernel_set({"avx2", "fma"}) == "avx2"
    assert torch_kernel_set({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}) == "avx512"
    assert torch_kernel_set(set()) == "default"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert torch_kernel_set({"avx2", "fma"}).startswith("default (capped")


def test_doctor_is_fast_and_imports_no_heavy_package():
    """Goal: under 3 s with the interpreter's start; the bound inside is generous for a shared machine."""
    probe = (
        "import sys, time, runpy; started = time.perf_counter(); sys.argv = ['specverify', 'doctor']\n"
        "try:\n    runpy.run_module('specverify', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm', 'sglang', 'lmdeploy', 'llama_cpp')\n"
        "         if m in sys.modules]\n"
        "print(f'{time.perf_counter() - started:.3f}', heavy or 'none', file=sys.stderr)"
    )
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    inside, heavy = completed.stderr.split()[-2:]
    print(f"specverify doctor: {time.perf_counter() - started:.2f} s with the interpreter's start, {inside} s inside")
    assert completed.returncode == 0 and heavy == "none", completed.stderr
    assert float(inside) < 3.0
