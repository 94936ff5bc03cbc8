"""The workload: which trajectories a run rolls out, as TrajectorySpecs.

Built once per run from its WorkloadConfig and seed; the sync and async drivers ask it for specs
and the agent loop replays them. Pure: no clock, no I/O after construction, no engine.

Operations:
    Workload.from_config(cfg, seed)    build from a family profile, a mix of them, or read cfg.trace
                                       (TraceError)
    trajectories_for_step(step, first, prompts)  sync: B prompts x G samples, prompt-major
                                       ("s{step}-p{p}-g{g}"), or only the first `first`; B given or cfg's
    trajectory(index)                  async: the index-th trajectory started ("a{index}"); groups of
                                       G consecutive indices share a prompt
    prompt_hardness(step, prompt)      the factor a GRPO group shares (1.0 for traces)
    family_of(step, prompt)            the family a prompt is drawn from (None for traces)
    mix_weights(step)                  a mix's weights at a step, normalised (None without a mix)
    context_budget(cfg)                the most context a trajectory reaches, in scaled tokens

Mixes: each prompt's family is drawn from the step's weights (cfg.mix, moving linearly to
cfg.mix_end by the last sync step) on a stream of its own, so every member of a group shares it and
a mix of one family draws exactly that family's trajectories.

Determinism: every spec is a function of (seed, step, prompt, group) alone. Each draw gets a
numpy Generator seeded from a SeedSequence of those ints, never a shared stream, so trajectory 17
is the same whether or not 0-16 were drawn (resume, sharded drivers, simulator = live).

Shaping, in this order (each keeps a prefix of the drawn turns, so caps never reshuffle draws):
    1. family context cap, in the family's own token units (the shape of the task)
    2. max_turns: keep the first max_turns turns
    3. token_scale on token counts (min 1; 0 stays 0), tool_time_scale on tool latencies
    4. max_context, in scaled units (the engine's real limit): end before the context (sum of
       appended + decode) would exceed it; turn 0 always stays, its prompt + decode clipped to fit
The last kept turn is marked done and its tool latency set to 0.

Trace replay runs the same slots (step, prompt, group or index) over the trace's trajectories in
order, cycling when more are asked for; slot labels replace the trace's so ids stay unique, and a
repeat of a trace trajectory gets a new seed. Steps 3-4 apply to traces too (identity by default).
Releases (start_s): sync keeps each one, relative to the step; async replays the trace in order of
release (stable: a trace without releases keeps its order), and a repeat is released one period
(the trace's last release) later per pass, so a cycled trace keeps staggering its starts.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from prorsa.agent.families import FAMILIES, Family, RawTurns, get_family
from prorsa.agent.trace import TraceError, TrajectorySpec, TurnSpec, read_trace
from prorsa.config.workload import WorkloadConfig

__all__ = ["TraceError", "TrajectorySpec", "TurnSpec", "Workload"]

# Tags keep the seed streams of different purposes apart. Keys must have a fixed length per tag:
# SeedSequence pads short entropy with zeros, so [s, 1, 2] and [s, 1, 2, 0] would collide.
_PROMPT, _MEMBER, _SPEC_SEED, _REPEAT, _FAMILY = 1, 2, 3, 4, 5


def _seq(*keys: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([k % 2**64 for k in keys])  # entropy must be non-negative


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(_seq(*keys))


def _uint32(*keys: int) -> int:
    return int(_seq(*keys).generate_state(1)[0])


class Workload:
    def __init__(self, cfg: WorkloadConfig, seed: int, *, family: Family | None,
                 trace: tuple[TrajectorySpec, ...] | None) -> None:
        """Draws from `family`, replays `trace`, or, with neither, draws from cfg.mix."""
        drawing_a_mix = family is None and trace is None
        if family is not None and trace is not None or drawing_a_mix and cfg.mix is None:
            raise ValueError("a Workload draws from a family or a mix, or replays a trace, exactly one")
        if trace is not None and not trace:
            raise TraceError(f"{cfg.trace}: the trace holds no trajectories")
        if trace is not None and cfg.mode == "async":
            trace = tuple(sorted(trace, key=lambda s: s.start_s or 0.0))
        self.cfg = cfg  # only the workload section (STYLE 9)
        self.seed = seed
        self.family = family  # None when replaying or mixing
        self.trace = trace  # None when drawing
        self._period = max((s.start_s or 0.0 for s in trace), default=0.0) if trace else 0.0
        self._mix = _mix_arrays(cfg) if drawing_a_mix else None

    @classmethod
    def from_config(cls, cfg: WorkloadConfig, seed: int) -> Workload:
        if cfg.trace is not None:
            # An explicitly given family labels trace lines that carry none; the default does not.
            label = cfg.family if cfg.family and "family" in cfg.model_fields_set else "trace"
            return cls(cfg, seed, family=None, trace=tuple(read_trace(cfg.trace, default_family=label)))
        if cfg.mix is not None:
            return cls(cfg, seed, family=None, trace=None)
        assert cfg.family is not None  # WorkloadConfig guarantees a family, a mix or a trace
        return cls(cfg, seed, family=get_family(cfg.family), trace=None)

    # --- slots --------------------------------------------------------------------------------

    def trajectories_for_step(self, step: int, first: int | None = None,
                              prompts: int | None = None) -> list[TrajectorySpec]:
        """Sync mode: the B x G trajectories of one training step, prompt-major (only the first
        `first` of them when given: each is drawn on its own, so they are the same ones);
        `prompts`: B for this step (the Python API's batch of tasks), else the pipeline's."""
        b, g = self.cfg.prompts if prompts is None else prompts, self.cfg.group_size
        n = b * g if first is None else min(first, b * g)
        return [self._slot(f"s{step}-p{i // g}-g{i % g}", step, i // g, i % g, slot=step * b * g + i)
                for i in range(n)]

    def trajectory(self, index: int) -> TrajectorySpec:
        """Async mode: the index-th trajectory started; index // G is its (global) prompt."""
        if index < 0:
            raise ValueError(f"trajectory index must be >= 0, got {index}")
        g = self.cfg.group_size
        return self._slot(f"a{index}", 0, index // g, index % g, slot=index)

    def opening_prompts(self) -> list[int]:
        """The prompt tokens of the trajectories a run starts at once (sync: the first step's
        batch; async: the first `concurrency`, those released at the start): what a rollout holds,
        counted, before its first prefill."""
        w = self.cfg
        if w.mode == "sync":
            specs = self.trajectories_for_step(0)
        else:
            n = w.concurrency if w.trajectories is None else min(w.concurrency, w.trajectories)
            specs = [self.trajectory(i) for i in range(n)]
        return [s.turns[0].appended_tokens for s in specs if not s.start_s]

    def prompt_hardness(self, step: int, prompt: int) -> float:
        if self.trace is not None:
            return 1.0
        family = self.family_of(step, prompt)
        assert family is not None
        return self._draw_prompt(family, step, prompt)[0]

    def family_of(self, step: int, prompt: int) -> Family | None:
        if self.trace is not None:
            return None
        if self._mix is None:
            return self.family
        names, _, _ = self._mix
        cum = np.cumsum(self._weights(step))
        # a stream of its own: the prompt's other draws are those its family alone would make; the
        # draw is scaled by the total so rounding never lands past it, on a family of weight 0
        pick = np.searchsorted(cum, _rng(self.seed, _FAMILY, step, prompt).random() * cum[-1], side="right")
        return FAMILIES[names[int(pick)]]

    def mix_weights(self, step: int) -> dict[str, float] | None:
        if self._mix is None:
            return None
        return {name: float(w) for name, w in zip(self._mix[0], self._weights(step)) if w > 0}

    def _weights(self, step: int) -> np.ndarray:
        assert self._mix is not None
        _, start, end = self._mix
        steps = self.cfg.steps
        f = step / (steps - 1) if steps > 1 and self.cfg.mode == "sync" else 0.0
        return (1 - f) * start + f * end

    # --- drawing and replaying ----------------------------------------------------------------

    def _slot(self, traj_id: str, step: int, prompt: int, member: int, *, slot: int) -> TrajectorySpec:
        if self.trace is not None:
            return self._replay(traj_id, step, prompt, member, slot)
        family = self.family_of(step, prompt)
        assert family is not None
        hardness, prompt_tokens = self._draw_prompt(family, step, prompt)
        raw = family.draw_turns(_rng(self.seed, _MEMBER, step, prompt, member), hardness, prompt_tokens)
        return TrajectorySpec(
            traj_id=traj_id, family=family.name, prompt_index=prompt, group_index=member,
            step=step, turns=self._shape(raw, family.context_cap, step),
            seed=_uint32(self.seed, _SPEC_SEED, step, prompt, member),
        )

    def _draw_prompt(self, family: Family, step: int, prompt: int) -> tuple[float, int]:
        return family.draw_prompt(_rng(self.seed, _PROMPT, step, prompt))

    def _replay(self, traj_id: str, step: int, prompt: int, member: int, slot: int) -> TrajectorySpec:
        assert self.trace is not None
        repeat, i = divmod(slot, len(self.trace))
        base = self.trace[i]
        raw = RawTurns(
            [t.appended_tokens for t in base.turns],
            [t.decode_tokens for t in base.turns],
            [t.tool_latency_s for t in base.turns],
        )
        start_s = base.start_s
        if repeat and start_s is not None and self.cfg.mode == "async":
            start_s += repeat * self._period
        return replace(
            base, traj_id=traj_id, step=step, prompt_index=prompt, group_index=member,
            turns=self._shape(raw, None, step), start_s=start_s,
            # A repeat must not share token ids with the original, or prefix caches would hit.
            seed=base.seed if repeat == 0 else _uint32(base.seed, _REPEAT, repeat),
        )

    def decode_scale(self, step: int) -> float:
        """Sync: how much step `step`'s decodes are drawn longer than step 0's (decode_growth)."""
        c = self.cfg
        return c.decode_growth ** (step / (c.steps - 1)) if c.steps > 1 else 1.0

    def _shape(self, raw: RawTurns, family_cap: int | None, step: int = 0) -> tuple[TurnSpec, ...]:
        appended, decode, tool = list(raw.appended), list(raw.decode), list(raw.tool_s)
        if (grown := self.decode_scale(step)) != 1.0:  # a longer response still meets the task's context bound
            decode = [_scale_tokens(d, grown) for d in decode]
        n = _fit_context(appended, decode, family_cap)
        if self.cfg.max_turns is not None:
            n = min(n, self.cfg.max_turns)
        appended, decode, tool = appended[:n], decode[:n], tool[:n]
        ts = self.cfg.token_scale
        if ts != 1.0:
            appended = [_scale_tokens(a, ts) for a in appended]
            decode = [_scale_tokens(d, ts) for d in decode]
        if self.cfg.tool_time_scale != 1.0:
            tool = [t * self.cfg.tool_time_scale for t in tool]
        n = _fit_context(appended, decode, self.cfg.max_context)
        return tuple(
            TurnSpec(appended[k], decode[k], 0.0 if k == n - 1 else tool[k], k == n - 1)
            for k in range(n)
        )


def context_budget(cfg: WorkloadConfig) -> int | None:
    """The most context a trajectory of this workload reaches, in the tokens its engines see:
    the family's cap (a mix: the largest), which bounds it in the family's own units, times
    token_scale, plus (scaled) a token for each count rounded up, two a turn; max_context where
    tighter. None without either. The cap itself misstates a scaled run: at token_scale 4, SWE
    trajectories reach 233k tokens against its 65,536."""
    names = list(cfg.mix or {}) or ([cfg.family] if cfg.family else [])
    ts = cfg.token_scale
    scaled = [f.context_cap if ts == 1.0 else
              math.ceil(f.context_cap * ts) + 2 * min(f.max_turns, cfg.max_turns or f.max_turns)
              for f in map(get_family, names)]
    budgets = [b for b in (max(scaled, default=None), cfg.max_context) if b is not None]
    return min(budgets, default=None)


def _mix_arrays(cfg: WorkloadConfig) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A mix as (families, shares at step 0, shares at the last step), in FAMILIES' order, so the
    draws do not depend on the order the pipeline lists them in. Shares, not raw weights, are
    interpolated: {swe: 3, math-tir: 1} to {math-tir: 1} moves math-tir's share evenly from 1/4."""
    assert cfg.mix is not None
    end = cfg.mix_end or cfg.mix
    names = [name for name in FAMILIES if name in cfg.mix or name in end]
    start_w, end_w = (np.array([m.get(n, 0.0) for n in names], float) for m in (cfg.mix, end))
    return names, start_w / start_w.sum(), end_w / end_w.sum()


def _scale_tokens(tokens: int, scale: float) -> int:
    return 0 if tokens == 0 else max(1, round(tokens * scale))


def _fit_context(appended: list[int], decode: list[int], cap: int | None) -> int:
    """How many leading turns fit in `cap` context tokens; may clip turn 0 in place to fit.

    Turn 0 always stays: a trajectory whose prompt alone overflows still runs one turn, with the
    decode shrunk first (keep the task) and then the prompt (keep >= 1 decoded token).
    """
    if cap is None:
        return len(appended)
    if appended[0] + decode[0] > cap:
        decode[0] = max(1, cap - appended[0])
        appended[0] = min(appended[0], cap - decode[0])
    total = 0
    for k, (a, d) in enumerate(zip(appended, decode)):
        if total + a + d > cap:
            return k
        total += a + d
    return len(appended)
