"""A weight update's cost by model size, as the project does it today (the "before" of faster sync).

For each shape, a Llama with random float32 weights is made locally (the tiny model's maker with a
larger TinyShape) and ONE vLLM CPU engine started on it; then each of N updates:
  write    the trainer's part: a state dict written as a model directory beside the base model's
           config and tokenizer (api/weights.py model_dir_for: safetensors, renamed into place whole)
  reload   the engine's part: VllmEngine.load_weights (vLLM's reload_weights through the dev-mode
           /collective_rpc endpoint), which also drops the cached prefixes
GB/s is the bytes of the weights (every tensor, float32) over the seconds of each part. Each update
flips the sign of one norm's weights, so every update is a new one (the bytes moved do not depend on
the values); after an odd number of them a fixed prompt must decode otherwise than before the first,
which shows the engine serves what it reloaded (output_changed).

    .venv/bin/python benchmarks/weight_sync.py [--shapes tiny,0.5b,1.5b] [--updates 3]
        [--out benchmarks/results/weight-sync.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from prorsa.engine.tiny_model import TinyShape  # noqa: E402

VOCAB = 2048  # the tiny tokenizer's vocabulary; len(tokenizer) may add a few special tokens
MAX_BYTES = 6 * 10**9  # a shape's weights, held up to three times over (state dict, its copy, engine): 23 GB of RAM
KV_BYTES = 256 * 2**20  # one 512-token sequence of the largest shape (the engine serves no request here)
# heads of 64 and 128 dims (CPU attention accepts both); KV heads half the heads, as TinyShape's
SHAPES = {
    "tiny": TinyShape(),
    "0.5b": TinyShape(hidden_size=1024, layers=32, heads=16, kv_heads=8),
    "1.5b": TinyShape(hidden_size=2048, layers=22, heads=16, kv_heads=8),
}


def param_count(shape: TinyShape, vocab: int = VOCAB) -> int:
    """The Llama make_tiny_model writes: untied embeddings and head, MLP 4x hidden, RMSNorm weights."""
    h = shape.hidden_size
    kv = shape.kv_heads * (h // shape.heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * 4 * h + 2 * h  # q, o; k, v; gate, up, down; two norms
    return 2 * vocab * h + shape.layers * per_layer + h


def weight_bytes(shape: TinyShape, vocab: int = VOCAB) -> int:
    return 4 * param_count(shape, vocab)  # float32


def parse_shapes(text: str) -> list[str]:
    """Comma-separated names of SHAPES; ValueError naming the first unknown one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in SHAPES:
            raise ValueError(f"--shapes: unknown shape {n!r} (known: {', '.join(SHAPES)})")
    return names


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


async def _measure(name: str, updates: int, root: Path, logs: Path) -> dict:
    from prorsa.api.weights import model_dir_for
    from prorsa.config.engines import VllmSettings
    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.roles import Role

    t0 = time.monotonic()
    base = _model(name, root)
    made_s = time.monotonic() - t0
    tensors = _state_dict(base)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    engine = VllmEngine(name, Role.MIXED, VllmSettings(dtype="float32", start_timeout_s=1200, cores_per_engine=0,
                                                     max_model_len=512, kv_cache_bytes=KV_BYTES),
                        base, Placement(), log_dir=logs)
    runs = []
    t0 = time.monotonic()
    try:
        await engine.start()
        start_s = time.monotonic() - t0
        before = await _greedy(engine)
        norm = next(k for k in tensors if k.endswith("norm.weight"))
        for k in range(updates):
            tensors[norm] = -tensors[norm]  # a new update each time, and one the outputs show
            out = root / f"wsync-{name}-update"
            w0 = time.monotonic()
            model_dir_for(tensors, base, out)
            w1 = time.monotonic()
            await engine.load_weights(out, timeout_s=1200)
            w2 = time.monotonic()
            runs.append({"write_s": w1 - w0, "reload_s": w2 - w1, "total_s": w2 - w0})
            print(f"{name}: update {k}: write {w1 - w0:.2f} s, reload {w2 - w1:.2f} s", flush=True)
        # an odd number of sign flips leaves the norm negated: the same prompt must decode otherwise
        changed = (await _greedy(engine)) != before
    finally:
        await engine.stop()
    shape = SHAPES[name]
    return {"name": name, "hidden": shape.hidden_size, "layers": shape.layers, "heads": shape.heads,
            "kv_heads": shape.kv_heads, "params": sum(t.numel() for t in tensors.values()), "bytes": nbytes,
            "make_s": made_s, "engine_start_s": start_s, "runs": runs,
            "output_changed": changed if updates % 2 else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--models", default=str(REPO / ".prorsa" / "models"), help="where the shapes' models are made")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "weight-sync.json"))
    args = ap.parse_args(argv)
    try:
        names = parse_shapes(args.shapes)
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
            doc["shapes"].append(asyncio.run(_measure(name, args.updates, Path(args.models), Path(logs))))
            # after every shape: a larger one that runs out of memory or time keeps the smaller ones
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if any(s["output_changed"] is False for s in doc["shapes"]) else 0


if __name__ == "__main__":
    sys.exit(main())
