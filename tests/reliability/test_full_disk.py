"""A disk that fills mid-run ends the command in one line that says how to go on, not a traceback."""

from __future__ import annotations

import errno
import json

import pytest

from prorsa.commands.run_folder import RunFolder
from prorsa.commands.stopping import roll_out


def test_no_space_left_is_one_line_pointing_at_the_resume(tmp_path, capsys):
    async def rollout() -> dict:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "parts" / "part-000003.parquet"))

    with pytest.raises(SystemExit) as ended:
        roll_out(rollout(), RunFolder(tmp_path, fresh=False), "p.yaml")
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1
    assert "no space left on the device writing" in err and f"prorsa run --resume {tmp_path}" in err


def test_other_os_errors_are_not_called_a_full_disk(tmp_path):
    async def rollout() -> dict:
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        roll_out(rollout(), RunFolder(tmp_path, fresh=False), "p.yaml")


FULL_DISK = """\
set -u
mount -t tmpfs -o size=2m tmpfs "$DISK"
head -c $((2048 * 1024 - 160 * 1024)) /dev/zero > "$DISK/filler"   # 160 KiB left: half a run's parts
"$PY" -m prorsa.cli run "$PIPELINE" --output "$DISK/run" > "$OUT/full.txt" 2>&1; echo $? > "$OUT/full.rc"
cp "$DISK/run/manifest.json" "$OUT/full-manifest.json" 2>/dev/null
rm "$DISK/filler"   # space freed
"$PY" -m prorsa.cli run --resume "$DISK/run" > "$OUT/resumed.txt" 2>&1; echo $? > "$OUT/resumed.rc"
cp -r "$DISK/run" "$OUT/run"
"""


def test_a_real_full_disk_ends_in_one_line_and_the_run_resumes_once_space_is_freed(tmp_path):
    # a 2 MiB tmpfs as the output, mounted in a user and mount namespace of the test's own
    import os
    import shutil
    import subprocess
    import sys

    from runs import assert_exactly_once, expected_specs, write_pipeline

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small tmpfs without privileges")
    pipeline = write_pipeline(tmp_path / "p.yaml", time_scale=0.05)
    (tmp_path / "disk").mkdir()
    (tmp_path / "out").mkdir()
    env = os.environ | {"DISK": str(tmp_path / "disk"), "OUT": str(tmp_path / "out"), "PY": sys.executable,
                        "PIPELINE": str(pipeline)}
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", FULL_DISK], env=env,
                          capture_output=True, text=True, timeout=600)
    if "mount: " in proc.stderr and not (tmp_path / "out" / "full.rc").exists():
        pytest.skip(f"this machine allows no tmpfs in a user namespace: {proc.stderr.strip()}")
    out = tmp_path / "out"
    full = (out / "full.txt").read_text()
    assert (out / "full.rc").read_text().strip() == "2", full
    errors = [line for line in full.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "no space left on the device" in errors[0], full
    assert "Traceback" not in full and "never retrieved" not in full, full
    assert not json.loads((out / "full-manifest.json").read_text())["complete"]  # nothing claimed complete
    resumed = (out / "resumed.txt").read_text()
    assert (out / "resumed.rc").read_text().strip() == "0", resumed
    assert json.loads((out / "run" / "manifest.json").read_text())["complete"]
    assert_exactly_once(out / "run", expected_specs(pipeline))
