"""benchmarks/weight_sync.py's pure parts, no engine: the shapes' sizes against the model the tiny
maker really writes, the shape list's bad input, and tables.py's rendering of a results file."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def ws():
    return load_script("weight_sync.py")


@pytest.fixture(scope="module")
def tables():
    return load_script("tables.py")


def test_param_count_is_what_the_tiny_maker_writes(ws, tmp_path):
    from safetensors import safe_open

    from prorsa.engine.tiny_model import TinyShape, make_tiny_model

    shape = TinyShape(hidden_size=64, layers=3, heads=2, kv_heads=1)  # head_dim 32, one KV head of two
    out = make_tiny_model(tmp_path / "m", seed=0, shape=shape)
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    written = 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        for k in f.keys():
            written += f.get_tensor(k).numel()
    assert ws.param_count(shape, vocab) == written
    assert ws.weight_bytes(shape, vocab) == 4 * written


def test_the_shapes_grow_and_fit_the_memory(ws):
    whole = [ws.weight_bytes(ws.SHAPES[n]) for n in ("tiny", "0.5b", "1.5b")]
    assert whole == sorted(whole) and len(set(whole)) == len(whole)
    assert max(ws.weight_bytes(s) for s in ws.SHAPES.values()) <= ws.MAX_BYTES
    wide = ws.SHAPES["8b-width"]  # an 8B's width, as many of its layers as fit
    assert (wide.hidden_size, wide.hidden_size // wide.heads, wide.kv_heads) == (4096, 128, 8)
    assert wide.layers < 32
    assert ws.param_count(ws.SHAPES["0.5b"]) == pytest.approx(0.5e9, rel=0.1)
    assert ws.param_count(ws.SHAPES["1.5b"]) == pytest.approx(1.4e9, rel=0.1)


def test_an_unknown_shape_is_one_line_and_exit_2(ws, capsys):
    assert ws.parse_shapes("tiny, 0.5b") == ["tiny", "0.5b"]
    with pytest.raises(ValueError, match="unknown shape '7b'"):
        ws.parse_shapes("tiny,7b")
    assert ws.main(["--shapes", "7b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("weight_sync.py: --shapes: unknown shape '7b'") and "\n" not in err
    assert ws.main(["--shapes", "tiny", "--updates", "0"]) == 2


def test_the_table_shows_medians_and_gb_per_s(tables):
    runs = [{"write_s": w, "reload_s": r, "total_s": w + r} for w, r in ((1.0, 4.0), (2.0, 2.0), (4.0, 3.0))]
    doc = {"dtype": "float32", "shapes": [{"name": "x", "params": 500_000_000, "bytes": 2 * 10**9, "hidden": 1024,
                                           "layers": 32, "engine_start_s": 61.4, "runs": runs, "output_changed": False}]}
    lines = tables.t_weight_sync({"weight-sync.json": doc})
    row = next(line for line in lines if line.startswith("| x |"))
    # medians: write 2.0 s, reload 3.0 s, update 5.0 s (of 5, 4, 7): 2 GB over each
    assert row == ("| x | 0.500B | 1024 x 32 | 2.00 | 1.00 + 4.00, 2.00 + 2.00, 4.00 + 3.00 | 2.00 | 3.00 | 5.00 "
                   "| 1.00 / 0.67 / 0.40 | 61 s | NO |")


def test_an_unknown_path_is_refused(ws):
    assert ws.parse_paths("disk, memory-changed") == ["disk", "memory-changed"]
    with pytest.raises(ValueError, match="unknown path 'nccl'"):
        ws.parse_paths("disk,nccl")
    assert ws.main(["--paths", "nccl"]) == 2


def test_the_paths_table_shows_each_paths_medians_and_its_speed_up_over_disk(tables):
    def runs(*totals, moved):
        return [{"write_s": t / 4, "reload_s": 3 * t / 4, "total_s": t, "bytes_moved": moved} for t in totals]

    doc = {"dtype": "float32", "shapes": [{"name": "x", "bytes": 2 * 10**9, "paths": {
        "disk": {"runs": runs(10.0, 8.0, 12.0, moved=2 * 10**9), "output_changed": True},
        "memory": {"runs": runs(2.0, 4.0, 3.0, moved=2 * 10**9), "output_changed": False},
        "memory-changed": {"runs": runs(0.1, 0.1, 0.2, moved=8192), "output_changed": True}}}]}
    wide = {"dtype": "float32", "shapes": [{**doc["shapes"][0], "name": "y"}]}
    lines = tables.t_weight_sync_paths({"weight-sync-paths.json": doc, "weight-sync-8b-width.json": wide})
    rows = [line for line in lines if line.startswith("| x |")]
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ")][-3:] == ["| y"] * 3  # the second file's after
    assert rows[0] == "| x | 2.00 | disk | 2000 | 2.50 | 7.50 | 10.00 | 0.20 | 1.0x | yes |"
    # medians 3.0 s (of 2, 4, 3): 2 GB / 3 s, and 10 / 3 of the disk path's time
    assert rows[1] == "| x | 2.00 | memory | 2000 | 0.75 | 2.25 | 3.00 | 0.67 | 3.3x | NO |"
    assert rows[2] == "| x | 2.00 | memory-changed | 0.00819 | 0.03 | 0.08 | 0.10 | 0.00 | 100.0x | yes |"


def test_the_rl_toy_table_compares_the_updates_of_both_weight_syncs(tables):
    def doc(sync, saves, pushes):
        return {"weight_sync": sync, "makespan_s": 100.0, "first": {"call_share": 0.4}, "last": {"call_share": 0.7},
                "updates": [{"version": i + 1, "save_s": s, "push_s": p} for i, (s, p) in enumerate(zip(saves, pushes))]}

    lines = tables.t_rl_toy_sync({"rl-toy-sync-disk.json": doc("disk", [0.3, 0.5, 0.4], [1.0, 1.2, 0.9]),
                                  "rl-toy-sync-memory.json": doc("memory", [0.05, 0.04, 0.06], [0.5, 0.4, 0.64])})
    # update: the median of each update's save + push (1.3, 1.7, 1.3), not the sum of the medians
    assert "| disk | 3 | 0.400 | 1.000 | 1.300 | 4.3 | 100 | 0.40 -> 0.70 |" in lines
    assert "| memory | 3 | 0.050 | 0.500 | 0.550 | 1.7 | 100 | 0.40 -> 0.70 |" in lines
