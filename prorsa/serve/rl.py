"""What an outside trainer steers in a served run (`/v1/rl/...`): a gate before the engines and the
policy version of the weights behind it.

    RlControl(weight_version, base, weights_dir)
    async with RlControl.turn()          a turn on the engines: waits while paused, counted while it runs
    await RlControl.pause()              new turns wait; returns once the turns in flight have ended
    RlControl.resume()                   waiting turns go on
    await RlControl.update(model_path, weight_version) -> int   new weights into every engine: the
                                         path made a model directory (api/weights.py), turns held
                                         while the engines load it, the version moved; -> the version
    RlControl.load                       how the engines load a model directory (the driver sets it:
                                         the RL loop's push, vLLM's reload_weights on every engine)

A turn in flight finishes on the weights it started with: a trainer pauses (or updates, which
pauses by itself) so that no reply mixes two policies and every turn's weight_version is true.
A stop while paused refuses the held turns as any queued request (ServeDriver's cut-off): they
were never in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from prorsa.api.weights import model_dir_for


class RlError(RuntimeError):
    """The engines could not take the new weights."""


class RlControl:
    def __init__(self, weight_version: int = 0, base: Path | None = None, weights_dir: Path | None = None) -> None:
        self.weight_version = weight_version
        self.base = base  # the model the engines started from: a file's weights go beside its config
        self.weights_dir = weights_dir  # where a .safetensors file becomes a model directory
        self.load: Callable[[Path], Awaitable[None]] | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        self.waiting = 0  # turns held at the gate
        self._paused_by_client = False
        self._updating = asyncio.Lock()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        self.waiting += 1
        try:
            while not self._open.is_set():
                await self._open.wait()
        finally:
            self.waiting -= 1
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def pause(self) -> None:
        self._paused_by_client = True
        await self._hold()

    def resume(self) -> None:
        self._paused_by_client = False
        if not self._updating.locked():
            self._open.set()

    async def _hold(self) -> None:
        self._open.clear()
        await self._idle.wait()

    async def update(self, model_path: str, weight_version: int | None = None) -> int:
        """Raises WeightsError (a path that is no model directory nor .safetensors file) before
        anything is held, RlError when the engines fail to load it (the version stays)."""
        if self.load is None:
            raise RlError("these engines cannot load weights")
        async with self._updating:
            version = self.weight_version + 1 if weight_version is None else weight_version
            out = (self.weights_dir or Path(model_path).parent) / f"v{version}"
            # made while the engines still serve: only the load itself holds turns
            model_dir = await asyncio.to_thread(model_dir_for, model_path, self.base, out)
            await self._hold()
            try:
                await self.load(model_dir)
                self.weight_version = version  # before the gate opens: every later turn is tagged with it
            except (OSError, RuntimeError, ValueError) as e:
                raise RlError(f"loading {model_path} failed: {e}") from e
            finally:
                if not self._paused_by_client:
                    self._open.set()
        return version
