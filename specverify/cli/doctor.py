"""``specverify doctor``: which audit levels, test markers and engines this machine can run, and why not.

Each row is one thing the suite can use (torch and its CPU kernel set, CUDA, the C kernel, the
Hugging Face stack and the packaged SmolLM2 GGUF, llama-cpp-python, the audited engines, a vLLM
CPU virtual environment), whether it is here, what it enables (an audit level or a ``pytest -m``
marker) and the command that installs a missing one.  Nothing heavy is imported: packages are
found with :func:`importlib.util.find_spec` and versions read from their metadata, so it takes
well under a second.  Exit status 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

VLLM_CPU_VENV = ".venv-vllm-cpu"
"""The folder (relative to the current directory) a vLLM CPU build is looked for in."""

TORCH_INSTALL = 'python3 -m pip install torch==2.13.0 -c constraints.txt -e ".[dev,hf,report,endpoint]"'


@dataclass(frozen=True)
class Row:
    """One capability: ``ok`` whether it is here, ``detail`` what was found (or why not),
    ``enables`` what it gives, ``fix`` the command that installs it (empty when there is nothing to do)."""

    name: str
    ok: bool
    detail: str
    enables: str
    fix: str = ""

    def lines(self) -> list[str]:
        head = f"[{'ok' if self.ok else '--'}] {self.name}: {self.detail}"
        lines = [head, f"     enables: {self.enables}"]
        if not self.ok and self.fix:
            lines.append(f"     fix: {self.fix}")
        return lines


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="say which audit levels, test markers and engines this machine can run, and why not",
        description="List what this machine has for specverify (torch and its CPU kernel set, CUDA, the C kernel, "
        "transformers + gguf and the packaged SmolLM2 GGUF, llama-cpp-python, vLLM / SGLang / lmdeploy, "
        f"a vLLM CPU venv at {VLLM_CPU_VENV}), what each enables and the command that fixes a missing one.",
    )
    parser.set_defaults(handler=run)


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution`` (from its metadata, never imported), None when absent."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def importable(module: str) -> bool:
    """Whether ``module`` can be found on ``sys.path`` (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cpu_flag_set() -> set[str]:
    from specverify.core.native_cache import cpu_flags

    return set(cpu_flags().split())


def torch_kernel_set(flags: set[str]) -> str:
    """The CPU kernel set torch dispatches to: the widest the CPU supports (AVX-512 needs F, BW, VL
    and DQ; AVX2 needs FMA too), capped by ``$ATEN_CPU_CAPABILITY``."""
    order = ["default", "avx2", "avx512"]
    best = (
        "avx512"
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
        else "avx2"
        if {"avx2", "fma"} <= flags
        else "default"
    )
    cap = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if cap in order and order.index(cap) < order.index(best):
        return f"{cap} (capped by ATEN_CPU_CAPABILITY={cap}; the CPU has {best})"
    return best


def torch_row() -> Row:
    found = installed("torch")
    flags = cpu_flag_set()
    isa = [name for name, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AMX", "amx_tile")) if flag in flags]
    if found is None:
        return Row(
            "torch",
            False,
            f"not installed (CPU ISA: {', '.join(isa) or 'none of AVX2, AVX-512, AMX'})",
            "every audit level and the test suite",
            TORCH_INSTALL,
        )
    return Row(
        "torch",
        True,
        f"{found}; CPU ISA: {', '.join(isa) or 'none of AVX2, AVX-512, AMX'}; kernel set {torch_kernel_set(flags)}",
        "the sampler, tree and decoder levels; the default test run",
    )


def cuda_row() -> Row:
    spec = importlib.util.find_spec("torch") if importable("torch") else None
    library = Path(spec.origin).parent / "lib" if spec is not None and spec.origin else None
    cuda_build = library is not None and any(library.glob("libtorch_cuda*"))
    driver = Path("/proc/driver/nvidia/version").exists()
    enables = "`pytest -m gpu`, `specverify audit --device cuda`"
    fix = "install a CUDA build of torch (https://pytorch.org/get-started/locally/) on a machine with an NVIDIA driver"
    if cuda_build and driver:
        return Row("CUDA", True, "torch is a CUDA build and an NVIDIA driver is loaded", enables)
    why = ("torch is a CPU-only build" if not cuda_build else "no NVIDIA driver is loaded") + (
        "" if cuda_build or driver else " and no NVIDIA driver is loaded"
    )
    return Row("CUDA", False, f"{why}; `pytest -m gpu` skips with the reason", enables, fix)


def native_kernel_row() -> Row:
    from specverify.core import native_cache

    enables = ("the fast CPU path of the chain and tree rules (the torch code is the fallback) and the worker's "
               "write guard (without it the audit compares every input after every call)")
    compiler = native_cache.compiler()
    if os.environ.get("SPECVERIFY_NATIVE", "1") == "0":
        return Row("C kernel", False, "switched off by SPECVERIFY_NATIVE=0", enables, "unset SPECVERIFY_NATIVE")
    if compiler is None:
        return Row(
            "C kernel",
            False,
            f"no C compiler ({os.environ.get('CC', 'cc')} not found)",
            enables,
            "install a C compiler (e.g. apt-get install gcc) or set CC",
        )
    built = native_cache.library_path(native_cache.SOURCE.read_bytes(), compiler, native_cache.FLAGS)
    if built.exists():
        return Row("C kernel", True, f"built ({built})", enables)
    return Row(
        "C kernel", True, f"not built yet: {compiler} builds it on first use (~1 s) into {built.parent}", enables
    )


def hf_rows() -> list[Row]:
    from specverify.hf.packaged import DEFAULT_TARGET, PACKAGED_MODELS

    stack = {name: installed(name) for name in ("transformers", "gguf")}
    missing = [name for name, found in stack.items() if found is None]
    rows = [
        Row(
            "transformers + gguf",
            not missing,
            ", ".join(f"{name} {found}" for name, found in stack.items() if found)
            + (f"; missing: {', '.join(missing)}" if missing else ""),
            "`specverify audit hf-transformers` (sampler, decoder levels); tests/hf",
            'python3 -m pip install -c constraints.txt -e ".[hf]"',
        )
    ]
    model = PACKAGED_MODELS[DEFAULT_TARGET]
    found = all(importable(module) for module in model.modules)
    rows.append(
        Row(
            "SmolLM2 GGUF",
            found,
            f"{model.name} ({', '.join(model.requirements)}) " + ("found" if found else "not installed"),
            "the real-model tests (`pytest -m gpu` CPU identity tests, tests/hf), `specverify models`",
            f"python3 -m {model.pip_command}",
        )
    )
    return rows


def llama_cpp_row() -> Row:
    found = installed("llama-cpp-python") if importable("llama_cpp") else None
    return Row(
        "llama-cpp-python",
        found is not None,
        found or "not installed",
        "`pytest -m server` (real llama.cpp servers at the endpoint level)",
        'python3 -m pip install -c constraints.txt -e ".[server]"   # compiles llama.cpp: ~5 min',
    )


def engine_rows() -> list[Row]:
    from specverify.engines import AUDITED_VERSIONS, INSTALL_HINTS

    rows = []
    for engine, audited in AUDITED_VERSIONS.items():
        found = installed(engine) if importable(engine) else None
        detail = (f"{found}" + ("" if found == audited else f" (audited: {audited})")) if found else "not installed"
        rows.append(
            Row(
                engine,
                found is not None,
                detail,
                f"the built-in targets `{engine}`… (`specverify audit --list`), `pytest -m engines`",
                f"{INSTALL_HINTS[engine]}   # every engine: python3 -m pip install --no-deps -r engines.txt",
            )
        )
    return rows


def vllm_cpu_venv_row(root: Path) -> Row:
    venv = root / VLLM_CPU_VENV
    enables = "a real vLLM server on CPU to audit at the endpoint level (docs/endpoint.md)"
    if not (venv / "bin" / "python").exists():
        return Row(
            "vLLM CPU venv",
            False,
            f"none at {venv} (optional)",
            enables,
            f"python3 -m venv {VLLM_CPU_VENV} and install vLLM's CPU build into it (vLLM's CPU installation guide)",
        )
    versions = sorted(venv.glob("lib/python*/site-packages/vllm-*.dist-info"))
    detail = (
        (f"{venv}: " + versions[-1].name.removesuffix(".dist-info").replace("-", " "))
        if versions
        else f"{venv} exists, without vllm installed"
    )
    return Row(
        "vLLM CPU venv",
        bool(versions),
        detail,
        enables,
        f"{VLLM_CPU_VENV}/bin/python -m pip install vllm (its CPU build)",
    )


def other_rows() -> list[Row]:
    return [
        Row(
            "httpx",
            installed("httpx") is not None,
            installed("httpx") or "not installed",
            "the endpoint level (`specverify audit --level endpoint`, `specverify demo-server`)",
            'python3 -m pip install -c constraints.txt -e ".[endpoint]"',
        ),
        Row(
            "hypothesis + pytest-xdist",
            all(installed(name) for name in ("hypothesis", "pytest-xdist")),
            ", ".join(f"{name} {installed(name) or 'missing'}" for name in ("hypothesis", "pytest-xdist")),
            "`specverify properties` and the test suite in parallel (`-n`)",
            'python3 -m pip install -c constraints.txt -e ".[dev]"',
        ),
    ]


def rows(root: Path | None = None) -> list[Row]:
    """Every row, in the order printed (``root``: where ``.venv-vllm-cpu`` is looked for; default the
    current directory)."""
    return [
        torch_row(),
        cuda_row(),
        native_kernel_row(),
        *hf_rows(),
        llama_cpp_row(),
        *engine_rows(),
        vllm_cpu_venv_row(root or Path.cwd()),
        *other_rows(),
    ]


def report(found: Sequence[Row]) -> str:
    """The printed report: one block per row, then what this machine cannot run."""
    lines = ["specverify doctor: what this machine can run ([ok] here, [--] missing, with the fix)"]
    for row in found:
        lines += row.lines()
    missing = [row.name for row in found if not row.ok]
    lines.append("missing: " + (", ".join(missing) if missing else "nothing"))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(report(rows()))
    return 0
