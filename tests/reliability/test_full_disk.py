"""A disk that fills mid-run ends the command in one line that says how to go on, not a traceback."""

from __future__ import annotations

import errno

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
