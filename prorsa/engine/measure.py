"""Measuring step times on a live vLLM engine, for calibrating the cost model (calibrate.py).

    Plan                         which prefill (new, cached) and decode (batch, context) shapes
    DEFAULT_PLAN, QUICK_PLAN     the grid `prorsa calibrate` measures (~3 min on one core); a few points
    measure(engine, plan, ...)   time every shape on a started engine -> [StepSample]
    calibration_engine(cfg)      one engine of a pipeline's vLLM backend, pinned like its first engine
    Measured                     the samples with what the profiles need from the engine
    calibrate_pipeline(cfg, plan, hardware_path, command)   measure, fit, write both profiles;
                                 returns the measured-vs-predicted table (`prorsa calibrate`)

Times are vLLM's own, from each response's per-request metrics (engine-core timestamps, so no
HTTP or API-server time): a prefill step is a max_tokens=1 request's scheduled-to-first-token
time; a decode step is first-to-last-token time over the tokens after the first, for a batch of
requests sent at once. Cached prefixes are made by a request for the prefix alone, in whole KV
blocks (vLLM caches only full blocks). Every repeat uses fresh random tokens, so nothing is cached
unless the plan says so; the reported cached count is what the sample records.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prorsa.costmodel.calibrate import StepSample
from prorsa.costmodel.profile_writer import FIT_MEDIAN_BOUND
from prorsa.engine.base import DecodeRequest
from prorsa.roles import Role
from prorsa.sampling import Sampling

BLOCK = 128  # vLLM CPU KV block size: prefixes are cached in whole blocks
TAIL = 8  # unique tokens after a shared decode prefix, so no two requests are the same prompt


@dataclass(frozen=True)
class Plan:
    prefill: tuple[tuple[int, int], ...]  # (new tokens, cached prefix), prefix a multiple of BLOCK
    decode: tuple[tuple[int, int], ...]  # (batch, prompt tokens before the first decode)
    repeats: int = 5
    decode_tokens: int = 32  # tokens per decode request: its step time is the mean over 31 steps

    def max_context(self) -> int:
        return max([n + c for n, c in self.prefill] + [c + TAIL + self.decode_tokens for _, c in self.decode])


DEFAULT_PLAN = Plan(
    prefill=((16, 0), (128, 0), (512, 0), (1024, 0), (1792, 0),
             (16, 1024), (128, 512), (512, 512), (128, 1024), (512, 1024), (128, 1536)),
    decode=((1, 128), (1, 1024), (4, 128), (4, 1024), (8, 512), (16, 128), (16, 512),
            (16, 1024), (32, 128), (32, 1024)),
)  # fmt: skip
QUICK_PLAN = Plan(prefill=((64, 0), (512, 0), (128, 512)), decode=((1, 128), (8, 512)), repeats=2,
                  decode_tokens=16)


@dataclass(frozen=True)
class Measured:
    samples: tuple[StepSample, ...]
    model_dir: Path  # the model the engine served (its config.json gives the architecture)
    kv_capacity_tokens: int  # KV tokens the engine holds (its explicit KV size)
    dtype: str


class _Tokens:
    """Fresh random token ids, deterministic from the seed; ids below 16 hold special tokens."""

    def __init__(self, seed: int, vocab: int):
        self._rng = random.Random(seed)
        self._hi = vocab - 1

    def __call__(self, n: int) -> tuple[int, ...]:
        return tuple(self._rng.randrange(16, self._hi) for _ in range(n))


async def _request(engine, ids: tuple[int, ...], max_tokens: int):
    req = DecodeRequest("calibrate", 0, context_tokens=len(ids), max_tokens=max_tokens,
                        token_ids=ids, sampling=Sampling(temperature=0.0), ignore_eos=True)
    return await engine.generate(req)


async def _prefill_once(engine, tokens: _Tokens, new: int, cached: int) -> tuple[float, int]:
    prefix = tokens(cached)
    if cached:
        await _request(engine, prefix, 1)
    out = await _request(engine, prefix + tokens(new), 1)
    return out.prefill_s, out.cached_tokens


async def _decode_once(engine, tokens: _Tokens, batch: int, context: int, steps: int) -> float:
    prefix = tokens(context)
    if context >= BLOCK:
        await _request(engine, prefix, 1)  # so the batch's prefill step is only the tails
    outs = await asyncio.gather(*(_request(engine, prefix + tokens(TAIL), steps) for _ in range(batch)))
    per_step = [o.decode_s / (o.n_tokens - 1) for o in outs if o.n_tokens > 1 and o.decode_s > 0]
    if not per_step:
        raise RuntimeError("the engine returned no decode timings (per-request metrics off?)")
    return statistics.median(per_step)


async def measure(engine, plan: Plan, *, seed: int = 0, vocab: int = 2048,
                  progress: Callable[[str], None] = lambda _: None) -> list[StepSample]:
    """Time every shape of `plan` on a started engine, one shape at a time (nothing else may use
    the engine meanwhile: a step's time is the whole engine's). The repeats go round the whole
    plan, so a burst of load from other processes spreads over shapes instead of skewing one."""
    tokens = _Tokens(seed, vocab)
    # vLLM's first steps of a shape pay lazy allocations: one of each extreme, untimed
    await _decode_once(engine, tokens, max(b for b, _ in plan.decode), BLOCK, 4)
    await _prefill_once(engine, tokens, max(n for n, _ in plan.prefill), 0)
    prefill: list[list[tuple[float, int]]] = [[] for _ in plan.prefill]
    decode: list[list[float]] = [[] for _ in plan.decode]
    for r in range(plan.repeats):
        for runs, (new, cached) in zip(prefill, plan.prefill):
            runs.append(await _prefill_once(engine, tokens, new, cached))
        for runs, (batch, context) in zip(decode, plan.decode):
            runs.append(await _decode_once(engine, tokens, batch, context, plan.decode_tokens))
        progress(f"repeat {r + 1} of {plan.repeats} done")
    samples = []
    for runs, (new, cached) in zip(prefill, plan.prefill):
        hit = min(c for _, c in runs)  # what vLLM reports as served from its prefix cache
        times = tuple(t for t, _ in runs)
        samples.append(StepSample("prefill", 1, new + cached - hit, hit, statistics.median(times), times))
    for times, (batch, context) in zip(decode, plan.decode):
        kv = context + TAIL + plan.decode_tokens / 2  # mean KV length over the timed steps
        samples.append(StepSample("decode", batch, 1, kv, statistics.median(times), tuple(times)))
    return samples


def calibration_engine(cfg, log_dir: Path):
    """A VllmEngine like the pipeline's first, at nice 0: the calibration measures the engine,
    not how the machine's other processes share its core."""
    from prorsa.engine.core_share import engine_cores
    from prorsa.engine.registry import resolve_model_dir
    from prorsa.engine.vllm import Placement, VllmEngine

    settings = cfg.engines.vllm.model_copy(update={"nice": 0})
    cores = engine_cores(0, settings.cores_per_engine) if settings.device == "cpu" else None
    return VllmEngine("calibrate", Role.MIXED, settings, resolve_model_dir(cfg.engines), Placement(cores), log_dir)


async def measure_pipeline(cfg, plan: Plan, log_dir: Path, *, seed: int = 0,
                           progress: Callable[[str], None] = lambda _: None) -> Measured:
    """Start one engine of the pipeline's backend, measure `plan` on it, stop it."""
    import json

    from prorsa.engine.registry import backend_of

    if not backend_of(cfg.engines).measurable:
        raise ValueError(f"engines.backend is {cfg.engines.backend!r}: calibration measures vllm engines")
    if plan.max_context() > cfg.engines.vllm.max_model_len:
        raise ValueError(f"the plan needs {plan.max_context()} tokens of context; "
                         f"engines.vllm.max_model_len is {cfg.engines.vllm.max_model_len}")
    engine = calibration_engine(cfg, log_dir)
    progress("starting one vLLM engine")
    await engine.start()
    try:
        vocab = json.loads((engine.server.spec.model_dir / "config.json").read_text())["vocab_size"]
        progress(f"engine up in {engine.server.start_s:.0f} s; measuring")
        samples = await measure(engine, plan, seed=seed, vocab=vocab, progress=progress)
        return Measured(tuple(samples), engine.server.spec.model_dir, engine.server.kv_capacity_tokens,
                        cfg.engines.vllm.dtype)
    finally:
        await engine.stop()


def _machine() -> str:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def calibrate_pipeline(cfg, plan: Plan, hardware_path: Path, command: str, log_dir: Path,
                       progress: Callable[[str], None] = lambda _: None, *, seed: int = 0,
                       max_miss: float = FIT_MEDIAN_BOUND) -> list[str]:
    """Measure one engine of the pipeline, fit, write the hardware profile to `hardware_path` and
    the model profile beside it; the lines of the measured-vs-predicted table."""
    import datetime as dt

    from prorsa.costmodel.profile_writer import (Provenance, error_rows, error_summary, model_path_for,
                                                 write_profiles)

    date = dt.datetime.now().astimezone().isoformat(timespec="minutes")
    load = os.getloadavg()[0]
    measured = asyncio.run(measure_pipeline(cfg, plan, log_dir, seed=seed, progress=progress))
    conditions = f"1-minute load average {load:.1f} before and {os.getloadavg()[0]:.1f} after measuring"
    name = "tiny" if cfg.engines.vllm.model == "tiny" else Path(cfg.engines.vllm.model).name
    model_path = model_path_for(hardware_path, name)
    prov = Provenance(date, command, _machine(), conditions)
    fit = write_profiles(measured, hardware_path, model_path, prov, max_miss)
    predicted = fit.predict(measured.samples)
    med, worst = error_summary(measured.samples, predicted)
    fitted = ", ".join(f"{k} {'fitted' if ok else 'a bound only'}" for k, ok in fit.identified.items())
    return error_rows(measured.samples, predicted) + [
        f"median absolute error {100 * med:.1f}%, max {100 * worst:.1f}% ({fitted})",
        f"step overhead {1e3 * fit.step_overhead_s:.2f} ms, linear {fit.linear_flops:.3g} FLOP/s, "
        f"attention {fit.attn_flops:.3g} FLOP/s, memory {fit.mem_bw:.3g} B/s",
        f"wrote {hardware_path} and {model_path}",
    ]
