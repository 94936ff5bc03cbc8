"""Rehearsals kept across runs: a hit gives the replay's own makespan, anything the replay reads is
part of the key, and a cache that cannot be used is passed by."""

import sqlite3
from dataclasses import replace

import pytest

from prorsa.agent.workload import Workload
from prorsa.config.pipeline import PipelineConfig
from prorsa.costmodel.misfit import ModelScale
from prorsa.rollout.context import resolve
from prorsa.sim import rehearsal_cache
from prorsa.sim.rehearse import rehearser
from prorsa.sim.run import simulate_async

CFG = PipelineConfig.model_validate({
    "name": "rehearsal-cache", "seed": 3, "policy": "colocated",
    "engines": {"count": 3, "slots": 64, "gpu": "h200", "model": "qwen3-30b-a3b", "ep": 2},
    "workload": {"family": "math-tir", "mode": "sync", "prompts": 4, "group_size": 4, "max_turns": 3}})
SPECS = Workload.from_config(CFG.workload, CFG.seed).trajectories_for_step(0)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRORSA_CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.delenv("PRORSA_DISABLE_REHEARSAL_CACHE", raising=False)
    monkeypatch.setattr(rehearsal_cache, "_memory", {})
    return tmp_path / "cache" / "rehearsals.sqlite"


def counted(cfg=CFG):
    """A rehearser whose replays are counted."""
    runs = []

    def simulate(*args, **kwargs):
        runs.append(args[1])
        return simulate_async(*args, **kwargs)

    return rehearser(resolve(cfg), simulate), runs


def test_a_second_rehearsal_is_read_back_exactly_even_in_another_process(cache):
    rehearse, runs = counted()
    first = rehearse(SPECS, (1, 2, 0))
    assert rehearse(SPECS, (1, 2, 0)) == first and len(runs) == 1
    rehearsal_cache._memory.clear()  # as a new process finds it: in the file alone
    again, runs_again = counted()
    assert again(SPECS, (1, 2, 0)) == first and runs_again == []
    with sqlite3.connect(cache) as con:
        assert con.execute("SELECT makespan_s FROM rehearsal").fetchall() == [(first,)]


def test_another_seed_or_name_of_the_same_rehearsal_hits(cache):
    """The seed draws nothing in a replay of given trajectories, the name nothing at all."""
    rehearse, _ = counted()
    first = rehearse(SPECS, (1, 2, 0))
    other, runs = counted(CFG.model_copy(update={"seed": 11, "name": "elsewhere"}))
    assert other(SPECS, (1, 2, 0)) == first and runs == []


def test_what_the_replay_reads_is_part_of_the_key(cache):
    rehearse, runs = counted()
    base = rehearse(SPECS, (1, 2, 0))
    rehearse(SPECS, (0, 0, 3))  # another split
    rehearse(SPECS[:-1], (1, 2, 0))  # other trajectories
    slower = rehearse(SPECS, (1, 2, 0), scale=ModelScale(decode=0.5))  # the model corrected
    assert rehearse(SPECS, (1, 2, 0), told=False) == base  # told no prior where none was: the same replay
    more = CFG.model_copy(update={"engines": CFG.engines.model_copy(update={"slots": 32})})
    counted_more, more_runs = counted(more)
    counted_more(SPECS, (1, 2, 0))  # other engines
    assert len(runs) == 4 and len(more_runs) == 1 and slower > base


def test_events_are_never_read_from_the_cache(cache):
    rehearse, runs = counted()
    rehearse(SPECS, (1, 2, 0))
    events: list = []
    rehearse(SPECS, (1, 2, 0), events=events)
    assert len(runs) == 2 and events


def test_switched_off_every_rehearsal_runs(cache, monkeypatch):
    monkeypatch.setenv("PRORSA_DISABLE_REHEARSAL_CACHE", "1")
    rehearse, runs = counted()
    rehearse(SPECS, (1, 2, 0))
    rehearse(SPECS, (1, 2, 0))
    assert len(runs) == 2 and not cache.exists()


def test_a_cache_that_cannot_be_used_is_passed_by_with_a_warning(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("PRORSA_CACHE_ROOT", str(blocked))
    monkeypatch.setattr(rehearsal_cache, "_memory", {})
    monkeypatch.setattr(rehearsal_cache, "_warned", type(rehearsal_cache._warned)())
    rehearse, runs = counted()
    with pytest.warns(RuntimeWarning, match="rehearsal cache .*run without it"):
        first = rehearse(SPECS, (1, 2, 0))
    assert first > 0 and len(runs) == 1


def test_a_damaged_cache_file_is_passed_by(cache, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_bytes(b"this is not sqlite" * 100)
    monkeypatch.setattr(rehearsal_cache, "_warned", type(rehearsal_cache._warned)())
    rehearse, runs = counted()
    with pytest.warns(RuntimeWarning, match="rehearsal cache"):
        assert rehearse(SPECS, (1, 2, 0)) > 0
    assert len(runs) == 1


def test_the_key_changes_with_the_package_source(monkeypatch):
    parts = ("a", 1.0, replace(ModelScale(), decode=2.0))
    before = rehearsal_cache.digest(parts)
    monkeypatch.setattr(rehearsal_cache, "source_digest", lambda: "another build")
    assert rehearsal_cache.digest(parts) != before
