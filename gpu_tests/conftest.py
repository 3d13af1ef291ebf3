"""Options and shared fixtures of the real-model tests in ``gpu_tests/``.

Which models: ``--target-model`` / ``--draft-model`` (or ``$SPECVERIFY_TARGET`` /
``$SPECVERIFY_DRAFT``) name a packaged model (``specverify models list``), a local Hugging Face
folder or a hub id; by default the target is SmolLM2-135M-Instruct and there is no draft model
(the model-free drafts still run).  The Qwen2.5-Coder 1.5B/0.5B pair runs in tests marked
``slow`` and skips with the pip line when its packages are not installed.

Which GPU: ``$SPECVERIFY_CUDA_DEVICE`` (default ``cuda``), e.g. ``cuda:1``
(:func:`specverify.hf.packaged.resolve_device`).

Model choices: ``"default"`` is the user's pair, ``"qwen-coder"`` the slow Qwen pair.

Reports: every identity test prints its report; with ``$SPECVERIFY_REPORT_DIR`` set, each also
appends one JSON line to ``$SPECVERIFY_REPORT_DIR/identity.jsonl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from specverify.hf import packaged as models

DEFAULT_CHOICE = "default"
QWEN_CHOICE = "qwen-coder"
REPORT_DIR_ENV = "SPECVERIFY_REPORT_DIR"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specverify-models", "specverify: real models for gpu_tests/")
    group.addoption(
        "--target-model", default=None,
        help=f"target for gpu_tests: packaged name, local HF folder or hub id (env {models.TARGET_ENV}; "
        f"default {models.DEFAULT_TARGET})",
    )
    group.addoption(
        "--draft-model", default=None,
        help=f"draft model for gpu_tests, sharing the target's vocabulary (env {models.DRAFT_ENV}; default none)",
    )


@pytest.fixture(scope="session")
def model_specs(pytestconfig: pytest.Config) -> dict[str, tuple[str, str | None]]:
    """Model choice -> (target spec, draft spec): the user's pair (options, env, defaults) and the Qwen pair."""
    target = pytestconfig.getoption("--target-model", default=None)
    draft = pytestconfig.getoption("--draft-model", default=None)
    return {DEFAULT_CHOICE: models.default_specs(target, draft), QWEN_CHOICE: models.SLOW_PAIR}


@pytest.fixture(scope="session")
def load_pair(model_specs: dict[str, tuple[str, str | None]]) -> Callable[[str, str, torch.dtype], models.ModelPair]:
    """``load_pair(choice, device, dtype)``: the loaded pair, once per session and key.

    The Qwen pair skips (with the pip line) when its packages are missing; the default target
    fails instead, since CI installs it.
    """
    loaded: dict[tuple[str, str, torch.dtype], models.ModelPair] = {}

    def load(choice: str, device: str, dtype: torch.dtype) -> models.ModelPair:
        key = (choice, models.resolve_device(device), dtype)
        if key not in loaded:
            target, draft = model_specs[choice]
            try:
                loaded[key] = models.load_model_pair(target, draft, dtype=dtype, device=key[1])
            except models.ModelNotInstalledError as error:
                if choice == DEFAULT_CHOICE:
                    raise
                pytest.skip(str(error))
        return loaded[key]

    return load


@pytest.fixture(scope="session")
def identity_log() -> Callable[[dict[str, Any]], None]:
    """``identity_log(record)``: print one test's report record and, with ``$SPECVERIFY_REPORT_DIR``,
    append it as a JSON line to ``identity.jsonl`` there."""
    folder = os.environ.get(REPORT_DIR_ENV)

    def log(record: dict[str, Any]) -> None:
        print(json.dumps(record, indent=1, default=str))
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            with open(Path(folder) / "identity.jsonl", "a") as sink:
                sink.write(json.dumps(record, default=str) + "\n")

    return log
