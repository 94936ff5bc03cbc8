"""`prorsa calibrate` on a real vLLM CPU engine (the quickstart's tiny model), with the quick plan:
the profiles it writes load, and predict the measurements recorded in them.

A loaded 2-core machine makes single CPU steps vary by 2x and more, and the quick plan fits four
constants to five shapes, so the tolerance is loose (35%, given to the command as --max-fit-miss,
whose 15% default refused a CI run's 18%): it catches a broken fit or a unit slip (a wrong time
base or bytes per weight is off by far more), not the fit's quality.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prorsa.costmodel import CostModel, load_gpu, load_model
from prorsa.costmodel.calibrate import StepSample, predict

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^#\s+(prefill|decode)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", re.M)


def test_calibrate_writes_profiles_that_predict_their_measurements(tmp_path):
    pipeline = yaml.safe_load((ROOT / "pipelines" / "quickstart.yaml").read_text())
    pipeline["output_dir"] = str(tmp_path / "runs")  # the server log goes there
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    hardware = tmp_path / "hardware" / "cpu.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "prorsa.cli", "calibrate", str(tmp_path / "p.yaml"),
         "--output", str(hardware), "--quick", "--seed", "7", "--max-fit-miss", "35"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    print(done.stdout, done.stderr[-2000:])
    assert done.returncode == 0

    cost = CostModel(load_gpu(str(hardware)), load_model(str(tmp_path / "models" / "tiny.yaml")))
    # the provenance repeats the command, seed and allowance included
    assert "--seed 7" in hardware.read_text() and "--max-fit-miss 35" in hardware.read_text()
    rows = ROW.findall(hardware.read_text())
    assert len(rows) == 5  # the quick plan: 3 prefill and 2 decode shapes
    errors = []
    for kind, batch, new, context, measured_ms, predicted_ms in rows:
        s = StepSample(kind, int(batch), int(new), float(context), float(measured_ms) / 1e3)
        assert predict(cost, s) * 1e3 == pytest.approx(float(predicted_ms), rel=0.01, abs=0.01)
        errors.append(abs(predict(cost, s) / s.seconds - 1))
    assert sorted(errors)[len(errors) // 2] < 0.35
