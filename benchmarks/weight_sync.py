"""A weight update's cost by model size and by path: today's disk round trip against shared memory.

For each shape, a Llama with random float32 weights is made locally (the tiny model's maker with a
larger TinyShape) and ONE vLLM CPU engine started on it; then N updates by each path:
  disk            write: a state dict written as a model directory beside the base model's config and
                  tokenizer (api/weights.py model_dir_for: safetensors, renamed into place whole);
                  reload: VllmEngine.load_weights (vLLM's reload_weights through /collective_rpc)
  memory          write: every tensor copied into a shared-memory region under /dev/shm
                  (shared_weights.py); reload: VllmEngine.load_shared, the engine's worker
                  loading them from the region through vLLM's in-place reload (worker_ext.py)
  memory-changed  the same, but the trainer compares its tensors with the region and copies only the
                  changed ones, and the engine loads only their layers: the case of a partly frozen
                  model (here: one norm changes, everything else is frozen)
Every reload also drops the cached prefixes. GB/s is the bytes the engine loaded over the seconds of
each part. Each update flips the sign of one norm's weights, so every update is a new one; after an
odd number of them a fixed prompt must decode otherwise than before the first, which shows the
engine serves what it loaded (output_changed).

    .venv/bin/python benchmarks/weight_sync.py [--shapes tiny,0.5b,1.5b,8b-width] [--updates 3]
        [--paths disk,memory,memory-changed] [--out benchmarks/results/weight-sync-paths.json]

benchmarks/results/weight-sync.json holds the disk path alone, as first measured (the script before
the memory paths).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from prorsa.engine.tiny_model import TinyShape  # noqa: E402

SHM = "/dev/shm"  # memory-backed: the region never touches a disk
VOCAB = 2048  # the tiny tokenizer's vocabulary; len(tokenizer) may add a few special tokens
MAX_BYTES = 6 * 10**9  # a shape's weights, held up to three times over (state dict, its copy, engine): 23 GB of RAM
KV_BYTES = 256 * 2**20  # one 512-token sequence of the largest shape (the engine serves no request here)
# heads of 64 and 128 dims (CPU attention accepts both); KV heads half the heads, as TinyShape's
SHAPES = {
    "tiny": TinyShape(),
    "0.5b": TinyShape(hidden_size=1024, layers=32, heads=16, kv_heads=8),
    "1.5b": TinyShape(hidden_size=2048, layers=22, heads=16, kv_heads=8),
    # an 8B's width (hidden 4096, 32 heads of 128, 8 KV heads) at 4 of its 32 layers: 3.9 GB, what
    # fits three times over; the whole 8B in float32 (32 GB) does not fit this machine once
    "8b-width": TinyShape(hidden_size=4096, layers=4, heads=32, kv_heads=8),
}


def param_count(shape: TinyShape, vocab: int = VOCAB) -> int:
    """The Llama make_tiny_model writes: untied embeddings and head, MLP 4x hidden, RMSNorm weights."""
    h = shape.hidden_size
    kv = shape.kv_heads * (h // shape.heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * 4 * h + 2 * h  # q, o; k, v; gate, up, down; two norms
    return 2 * vocab * h + shape.layers * per_layer + h


def weight_bytes(shape: TinyShape, vocab: int = VOCAB) -> int:
    return 4 * param_count(shape, vocab)  # float32


def _names(text: str, known, flag: str, what: str) -> list[str]:
    """Comma-separated names of `known`; ValueError naming the first unknown one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in known:
            raise ValueError(f"{flag}: unknown {what} {n!r} (known: {', '.join(known)})")
    return names


def parse_shapes(text: str) -> list[str]:
    return _names(text, SHAPES, "--shapes", "shape")


def parse_paths(text: str) -> list[str]:
    return _names(text, PATHS, "--paths", "path")


def _model(name: str, root: Path) -> Path:
    """The shape's model directory, made once (seed 0) and kept under `root`."""
    from prorsa.engine.tiny_model import make_tiny_model

    out = root / f"wsync-{name}"
    if not (out / "config.json").exists():  # config.json is written after the weights
        make_tiny_model(out, seed=0, shape=SHAPES[name])
    return out


def _state_dict(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    tensors: dict = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


async def _greedy(engine) -> tuple[int, ...]:
    from prorsa.engine.base import DecodeRequest
    from prorsa.engine.vllm.protocol import GREEDY

    ids = tuple(range(16, 80))
    out = await engine.generate(DecodeRequest("probe", 0, len(ids), 8, ids, sampling=GREEDY))
    return tuple(out.token_ids)


PATHS = ("disk", "memory", "memory-changed")


async def _disk_update(engine, tensors: dict, base: Path, out: Path) -> dict:
    """Today's path: the state dict written as a model directory, reloaded through reload_weights."""
    from prorsa.api.weights import model_dir_for

    w0 = time.monotonic()
    model_dir_for(tensors, base, out)
    w1 = time.monotonic()
    await engine.load_weights(out, timeout_s=1200)
    w2 = time.monotonic()
    return {"write_s": w1 - w0, "reload_s": w2 - w1, "total_s": w2 - w0, "bytes_moved": _bytes(tensors)}


async def _memory_update(engine, tensors: dict, region, changed_only: bool) -> dict:
    """The shared-memory path: the trainer's tensors copied into the region (every one, or those
    whose content changed), the engine's worker loading them from it (shared_weights.py)."""
    w0 = time.monotonic()
    manifest = region.publish(tensors.items(), changed_only=changed_only)
    w1 = time.monotonic()
    loaded = await engine.load_shared(manifest, timeout_s=1200)
    w2 = time.monotonic()
    return {"write_s": w1 - w0, "reload_s": w2 - w1, "total_s": w2 - w0, "bytes_moved": loaded["bytes"],
            "bytes_written": manifest.written_bytes, "tensors_loaded": loaded["tensors"]}


def _bytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


async def _path_runs(engine, path: str, tensors: dict, io: tuple[Path, Path, object], updates: int) -> dict:
    """`updates` updates by one path, each flipping the sign of one norm (a new update each time, and
    one the outputs show); memory-changed starts from a region already in sync (one full publish,
    untimed), so only that norm's layer moves."""
    base, out, region = io
    norm = next(k for k in tensors if k.endswith("norm.weight"))
    if path == "memory-changed":
        await engine.load_shared(region.publish(tensors.items(), changed_only=False))
    before = await _greedy(engine)
    runs = []
    for k in range(updates):
        tensors[norm] = -tensors[norm]
        if path == "disk":
            runs.append(await _disk_update(engine, tensors, base, out))
        else:
            runs.append(await _memory_update(engine, tensors, region, path == "memory-changed"))
        r = runs[-1]
        print(f"{path}: update {k}: write {r['write_s']:.2f} s, reload {r['reload_s']:.2f} s, "
              f"{r['bytes_moved'] / 1e9:.3f} GB", flush=True)
    # an odd number of sign flips leaves the norm negated: the same prompt must decode otherwise
    changed = (await _greedy(engine)) != before if updates % 2 else None
    if updates % 2:
        tensors[norm] = -tensors[norm]  # the next path starts from the engine's weights
        await _disk_update(engine, tensors, base, out) if path == "disk" else \
            await _memory_update(engine, tensors, region, False)
    return {"runs": runs, "output_changed": changed}


async def _measure(name: str, updates: int, root: Path, logs: Path, paths: list[str]) -> dict:
    from prorsa.config.engines import VllmSettings
    from prorsa.shared_weights import SharedRegion
    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.roles import Role

    t0 = time.monotonic()
    base = _model(name, root)
    made_s = time.monotonic() - t0
    tensors = _state_dict(base)
    engine = VllmEngine(name, Role.MIXED, VllmSettings(dtype="float32", start_timeout_s=1200, cores_per_engine=0,
                                                     max_model_len=512, kv_cache_bytes=KV_BYTES),
                        base, Placement(), log_dir=logs)
    region = SharedRegion(Path(SHM) / f"prorsa-wsync-{name}-{os.getpid()}")
    by_path = {}
    t0 = time.monotonic()
    try:
        await engine.start()
        start_s = time.monotonic() - t0
        for path in paths:
            by_path[path] = await _path_runs(engine, path, tensors, (base, root / f"wsync-{name}-update", region),
                                             updates)
    finally:
        region.unlink()
        await engine.stop()
    shape = SHAPES[name]
    return {"name": name, "hidden": shape.hidden_size, "layers": shape.layers, "heads": shape.heads,
            "kv_heads": shape.kv_heads, "params": sum(t.numel() for t in tensors.values()), "bytes": _bytes(tensors),
            "make_s": made_s, "engine_start_s": start_s, "paths": by_path}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--paths", default=",".join(PATHS), help="weight paths to time, in this order")
    ap.add_argument("--models", default=str(REPO / ".prorsa" / "models"), help="where the shapes' models are made")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "weight-sync-paths.json"))
    args = ap.parse_args(argv)
    try:
        names = parse_shapes(args.shapes)
        paths = parse_paths(args.paths)
    except ValueError as e:
        print(f"weight_sync.py: {e}", file=sys.stderr)
        return 2
    if args.updates < 1:
        print("weight_sync.py: --updates: at least 1", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    doc = {"command": "python benchmarks/weight_sync.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%F"), "commit": commit,
           "machine": f"{platform.machine()}, {platform.system()}, 2 cores", "dtype": "float32",
           "shapes": []}
    with tempfile.TemporaryDirectory(prefix="weight-sync-") as logs:
        for name in names:
            doc["shapes"].append(asyncio.run(_measure(name, args.updates, Path(args.models), Path(logs), paths)))
            # after every shape: a larger one that runs out of memory or time keeps the smaller ones
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if any(p["output_changed"] is False for s in doc["shapes"] for p in s["paths"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
