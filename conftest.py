"""Root conftest: the Hypothesis profile, torch threads per xdist worker, the CUDA skip for `gpu`
tests, and the skip of a path torch cannot run under a forced kernel set on this CPU.

The default run (`pytest`, see pyproject's addopts) excludes `slow`; `pytest -m gpu` selects the
GPU tests, which skip with a reason where CUDA is absent so that the run still exits 0.  When the
`-m` expression selects only `gpu` tests and CUDA is absent, every test module skips at
collection, unimported (seconds instead of collecting the whole suite to skip it); otherwise
each `gpu` test skips on its own.
The seed, budget and implementation options come from the specverify plugin
(`--specverify-seed N|random`, `--specverify-alpha`, `--specverify-impl`), and so do the
markers `gpu`, `slow` and `statistical` (registered once, by the plugin).
"""

from __future__ import annotations

import os

import pytest

from specverify.core.plan_cache import SWITCH_ENV
from specverify.engines.environment import prepare_engine_import
from specverify.testing.kernel_sets import forced_kernel_set, is_kernel_set_limitation
from specverify.testing.profiles import load_profile
from specverify.testing.pytest_plugin import selects_only_gpu

# Loaded here too so that a plain checkout (PYTHONPATH=.) gets the options; when the package is
# installed the entry point registers the same module under the same name and this is a no-op.
pytest_plugins = ("specverify.testing.pytest_plugin",)

load_profile()  # derandomized, no deadline (specverify.testing.profiles); SPECVERIFY_HYPOTHESIS_PROFILE=explore

# Engine kernels (tests/engines) run under Triton's interpreter without a GPU, and Triton reads
# TRITON_INTERPRET once, when it is first imported; transformers' import of torch._dynamo imports
# Triton too, so the variable is set before any test module is collected (no-op with CUDA).
prepare_engine_import()

# The tests compute every planning figure: none reads a figure an earlier run stored
# (specverify.core.plan_cache; its own tests switch it on in a temporary cache).
os.environ.setdefault(SWITCH_ENV, "0")


NO_CUDA = "CUDA is not available on this machine (torch.cuda.is_available() is False)"


def pytest_configure(config: pytest.Config) -> None:
    _share_cores_between_xdist_workers()
    import torch

    config._skip_all_without_cuda = selects_only_gpu(config.option.markexpr) and not torch.cuda.is_available()


class ModuleSkippedWithoutCuda(pytest.Module):
    """A test module of a `gpu`-only run on a machine without CUDA: skipped, never imported."""

    def collect(self):
        pytest.skip(f"{NO_CUDA}; `-m {self.config.option.markexpr}` selects only gpu tests")


def pytest_pycollect_makemodule(module_path, parent):
    if parent.config._skip_all_without_cuda:
        return ModuleSkippedWithoutCuda.from_parent(parent, path=module_path)
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A `gpu`-only run without CUDA collected no test (every module skipped): that is a pass, exit 0."""
    if session.config._skip_all_without_cuda and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


def _share_cores_between_xdist_workers() -> None:
    """Under `pytest -n N`, give each worker cores/N torch threads instead of all of them.

    Every worker otherwise starts one intra-op thread per core, and N workers on N cores then
    oversubscribe the machine several times over (the default run took ~3x longer on 2 cores).
    ``OMP_NUM_THREADS`` carries the same share to the processes a test starts (a CLI audit, a
    server), unless the run sets it itself.
    """
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return
    import torch

    threads = max(1, (os.cpu_count() or 1) // int(workers))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Under a forced ``ATEN_CPU_CAPABILITY``, a kernel torch refuses to run on this CPU skips the
    test with torch's reason (:mod:`specverify.testing.kernel_sets`); every other error fails."""
    try:
        return (yield)
    except RuntimeError as error:
        if not is_kernel_set_limitation(error):
            raise
        pytest.skip(f"ATEN_CPU_CAPABILITY={forced_kernel_set()}: torch cannot run this path on this CPU "
                    f"({str(error).splitlines()[0]})")
