"""Weights handed from a trainer to engines on the same node through shared memory, no file on disk.

    SharedRegion(path)                  a memory-backed file (under /dev/shm) holding one copy of
                                        every tensor of the model, laid out once; the trainer's side
    region.publish(named, changed_only) -> WeightManifest   copy the trainer's tensors in (only those
                                        whose content differs from what the region holds, when
                                        changed_only) and say which tensors the engines should load
    region.close() / region.unlink()    drop the mapping / remove the file
    WeightManifest                      what crosses to the engines (JSON): the region's path and
                                        layout, and the names to load (None: all of them)
    read_tensors(manifest, names)       (name, tensor) pairs over the region's pages, zero-copy: the
                                        engine's side (engine/vllm/worker_ext.py), called in vLLM's
                                        worker process
    sync_groups(names, packed) / expand_to_groups(changed, names, packed)   which tensors an engine
                                        must load together (below)

Why a region rather than a fresh buffer per update: it doubles as the engines' last-synced state,
so the trainer finds what changed by comparing its tensors with the region (no hashes, no second
copy), and an engine that restarts reloads the newest weights from it.

Why changed tensors come with their siblings: vLLM fuses checkpoint tensors into one layer (q, k, v
into qkv_proj; gate and up into gate_up_proj) and re-processes a layer only once all of its inputs
arrived (model_loader/reload/layerwise.py); a layer fed part of its inputs is processed with the rest
uninitialised. So a changed q_proj brings k_proj and v_proj along, and a changed expert its whole
fused-experts layer. Layers that get nothing keep their weights.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ALIGN = 64  # bytes: every tensor starts on a cache line, so a view is aligned for any dtype
# vLLM Llama/Qwen/Mistral's packed_modules_mapping: what a trainer assumes when its engine does not say
DEFAULT_PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass(frozen=True)
class TensorSlot:
    """One tensor's place in the region."""

    name: str  # the checkpoint name (what model.load_weights takes)
    dtype: str  # torch dtype without the "torch." prefix, e.g. "float32"
    shape: tuple[int, ...]
    offset: int  # bytes from the region's start
    nbytes: int


@dataclass(frozen=True)
class WeightManifest:
    """What an engine needs to load a published update."""

    path: str  # the region's file
    slots: tuple[TensorSlot, ...]  # every tensor in the region
    load: tuple[str, ...] | None  # names whose content changed in this update; None: every one
    written_bytes: int  # bytes the trainer copied into the region for this update

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WeightManifest:
        d = json.loads(text)
        slots = tuple(TensorSlot(s["name"], s["dtype"], tuple(s["shape"]), s["offset"], s["nbytes"]) for s in d["slots"])
        load = None if d["load"] is None else tuple(d["load"])
        return cls(d["path"], slots, load, d["written_bytes"])

    def whole(self) -> WeightManifest:
        """Every tensor: what a restarted engine loads, since it starts from the base model."""
        return WeightManifest(self.path, self.slots, None, 0)


def sync_group(name: str, packed: Mapping[str, Sequence[str]] = DEFAULT_PACKED) -> str:
    """The vLLM layer a checkpoint tensor feeds: its module, with a packed part named by the fused
    module it goes into, and an expert by its experts layer."""
    parts = name.split(".")[:-1]  # the module; the leaf is weight / bias
    if "experts" in parts:
        return ".".join(parts[:parts.index("experts") + 1])
    if parts:
        leaf = parts[-1]
        fused = next((f for f, members in packed.items() if leaf in members), None)
        if fused is not None:
            parts[-1] = fused
    return ".".join(parts)


def expand_to_groups(changed: Iterable[str], names: Sequence[str],
                     packed: Mapping[str, Sequence[str]] = DEFAULT_PACKED) -> list[str]:
    """Every name in `names` whose layer has a changed tensor, in `names` order."""
    groups = {sync_group(n, packed) for n in changed}
    return [n for n in names if sync_group(n, packed) in groups]


def _layout(named: Sequence[tuple[str, Any]]) -> tuple[TensorSlot, ...]:
    slots, offset = [], 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        slots.append(TensorSlot(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return tuple(slots)


def _view(buf, slot: TensorSlot):
    import torch

    dtype = getattr(torch, slot.dtype)
    count = slot.nbytes // dtype.itemsize
    with warnings.catch_warnings():  # a read-only mapping: the engine copies out of it, never into it
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(buf, dtype=dtype, count=count, offset=slot.offset) if count else \
            torch.empty(0, dtype=dtype)
    return flat.view(slot.shape)


class SharedRegion:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.slots: tuple[TensorSlot, ...] = ()
        self._map: mmap.mmap | None = None

    def _allocate(self, slots: tuple[TensorSlot, ...]) -> None:
        self.close()
        size = max((s.offset + s.nbytes for s in slots), default=0)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            self._map = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        self.slots = slots

    def publish(self, named: Iterable[tuple[str, Any]], changed_only: bool = True) -> WeightManifest:
        """The first publish, or one whose names, dtypes or shapes differ, lays the region out anew
        and writes everything (the engines load it all)."""
        import torch

        named = [(n, t.detach().to("cpu").contiguous()) for n, t in named]
        slots = _layout(named)
        fresh = slots != self.slots or self._map is None
        if fresh:
            self._allocate(slots)
        load, written = [], 0
        with torch.no_grad():
            for slot, (name, t) in zip(self.slots, named):
                view = _view(self._map, slot)
                if not fresh and changed_only and torch.equal(view, t):
                    continue
                view.copy_(t)
                load.append(name)
                written += slot.nbytes
        every = fresh or not changed_only
        return WeightManifest(str(self.path), self.slots, None if every else tuple(load), written)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def unlink(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def read_tensors(manifest: WeightManifest, names: Sequence[str] | None = None) -> Iterator[tuple[str, Any]]:
    """The named tensors (None: all), each a view of the region's pages: the loader's copy into the
    model is the only one. The mapping lives as long as the views do."""
    wanted = None if names is None else set(names)
    with open(manifest.path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    for slot in manifest.slots:
        if wanted is None or slot.name in wanted:
            yield slot.name, _view(buf, slot)
