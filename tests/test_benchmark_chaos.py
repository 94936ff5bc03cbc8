"""benchmarks/chaos.py --partial and chaos_serve.py: what they count as lost, duplicated and dropped,
on rows shaped as trajectories.parquet's."""

from __future__ import annotations

import argparse
import json

import pytest

from tests.benchmark_scripts import load_script

ARGS = argparse.Namespace(trajectories=8, prompts=2, group_size=2, partial=True)  # 2 steps of 2 groups of 2


@pytest.fixture(scope="module")
def chaos():
    return load_script("chaos.py")


@pytest.fixture(scope="module")
def serve():
    return load_script("chaos_serve.py")


def _row(traj: str, status: str = "completed", trained: int | None = None, turns: int = 1) -> dict:
    return {"traj_id": traj, "status": status, "trained_step": trained, "turns": [{"turn": k} for k in range(turns)]}


def _steps(step_groups: dict[int, list[str]]) -> list[dict]:
    return [_row(f"{g}-g{m}", trained=s) for s, groups in step_groups.items() for g in groups for m in range(2)]


@pytest.fixture
def run_dir(tmp_path):
    # the journal's last driver state: 3 groups started in step 0, 2 in step 1
    (tmp_path / "manifest.json").write_text(json.dumps({"driver_state": {"started": {"0": 3, "1": 2}}}))
    return tmp_path


def test_every_trained_member_once_and_drops_apart(chaos, run_dir):
    rows = _steps({0: ["s0-p0", "s0-p1"], 1: ["s1-p0", "s1-p1"]}) + [_row("s0-p2-g0", "stale"),
                                                                     _row("s0-p2-g1", "cancelled")]
    c = chaos.count_partial(ARGS, rows, run_dir)
    assert (c["lost"], c["duplicated"], c["dropped"], c["failed"], c["unreported"]) == (0, 0, 2, 0, 0)
    assert c["trained"] == 8 and c["steps_trained"] == 2


def test_a_member_short_loses_its_group_and_a_row_twice_is_duplicated(chaos, run_dir):
    rows = _steps({0: ["s0-p0", "s0-p1"], 1: ["s1-p0", "s1-p1"]})
    rows = [r for r in rows if r["traj_id"] != "s1-p1-g1"] + [rows[0], _row("s0-p2-g0", "failed")]
    c = chaos.count_partial(ARGS, rows, run_dir)
    # s1-p1 is short a member, so step 1 trained one whole group; s0-p2-g1 started with no row
    assert (c["unreported"], c["lost"]) == (2, 3)  # s1-p1-g1 and s0-p2-g1 have no row; s1-p1-g0 no group
    assert (c["duplicated"], c["failed"], c["steps_trained"]) == (1, 1, 1)


def test_answered_turns_saved_once(serve):
    rows = [_row("c0", turns=3), _row("c1", turns=2)]
    ok = serve.saved_turns(rows, [("c0", 0), ("c0", 1), ("c0", 2), ("c1", 0)])
    assert (ok["lost"], ok["duplicated"], ok["saved_unanswered"]) == (0, 0, 1)
    bad = serve.saved_turns([*rows, _row("c1", turns=1)], [("c0", 0), ("c2", 0)])
    assert (bad["lost"], bad["duplicated"]) == (1, 2)  # c2 unsaved; c1 a second row, its turn 0 twice
