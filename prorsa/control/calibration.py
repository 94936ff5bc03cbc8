"""Online calibration: the policy's model held against what the engines did, and corrected.

    PhaseClock()                  folds lifecycle events into per-phase leg times
      .observe(event)             every event the policy sees (and a rehearsal's, for its prediction)
      .rates() -> PhaseRates      seconds per token of the prefill legs and of the generating legs
    Calibration()                 the correction the policy rehearses with, and its measured error
      .begin(time_s, split)       a synchronous step opens in `split`
      .observe(event) / .moved()  every event the policy sees; a role change asked mid-step
      .end(finished, rehearse) -> str   between steps: the step that ended, if it kept its split,
                                  replayed in it and held against what the run showed (update)
      .update(seen, predicted, seen_s, predicted_s) -> str   one replay folded in: the error, and the
                                  correction moved toward what was seen
      .scale                      ModelScale to rehearse with (composed onto the body's model)
      .error                      |seen / predicted - 1| of the last step's makespan, None before one
      .margin(floor)              the gain a rehearsed move must show: the floor or the error

The comparison is like with like: the step that just ran, replayed in the simulator on the same
trajectories (as they ran: appends, decodes, tool times) and the same split, gives the same
lifecycle events the run gave; the same PhaseClock reads both. A prefill leg (PREFILL -> DECODE)
is a prefill engine's queue and compute, a generating leg (DECODE -> TOOL) a decode engine's
transfer, queue and decode, or on a mixed engine the whole turn. Seconds per token of the first
measure the model's prefill (compute) throughput, of the second its decode (memory) throughput;
where a split has no prefill engines only the second is seen, and only decode is corrected.
This is what NVIDIA Dynamo's planner does with actual over expected TTFT and ITL, with the
rehearsal as the expectation instead of a profile lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prorsa.agent.trace import TrajectorySpec
from prorsa.control.lifecycle import LifecycleEvent, Phase
from prorsa.costmodel.misfit import ModelScale

# MIN_LEGS, MAX_STEP, ROUNDS and DEADBAND were chosen on the tuning set's SWE MoE sync cell (seed 0,
# model_error.py --steps 3); the other cells of that table and its held-out seeds chose none.
# Legs of each kind a step must show before its rate is compared: fewer say more of the draw than
# of the model.
MIN_LEGS = 32
# One step moves the correction by at most this factor either way: queueing makes leg times react
# more than one-for-one to a throughput error, so a full correction at once could overshoot.
MAX_STEP = 1.5
# Replays of one step per calibration at most: each moves the model toward what the step showed.
ROUNDS = 3
# A rate this close to the prediction is left alone: a replay of the same trajectories in the same
# split differs from the run by routing and release order alone, ~1-2% on the paper's cells
# (tests/control/test_calibration.py pins the exact model's case).
DEADBAND = 0.03


@dataclass(frozen=True)
class PhaseRates:
    prefill_s: float  # prefill legs' seconds, summed
    prefill_tokens: int  # tokens they prefilled (the appends)
    prefill_legs: int
    decode_s: float  # generating legs' seconds, summed
    decode_tokens: int  # tokens they generated
    decode_legs: int

    def prefill_per_token(self) -> float | None:
        return self.prefill_s / self.prefill_tokens if self.prefill_legs >= MIN_LEGS and self.prefill_tokens else None

    def decode_per_token(self) -> float | None:
        return self.decode_s / self.decode_tokens if self.decode_legs >= MIN_LEGS and self.decode_tokens else None


class PhaseClock:
    """Leg times from lifecycle events: a leg starts at its phase's event and ends at the next."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, int], tuple[Phase, float, int]] = {}  # (traj, turn) -> phase, since, tokens
        self._sums = [0.0, 0, 0, 0.0, 0, 0]

    def observe(self, ev: LifecycleEvent) -> None:
        key = (ev.traj_id, ev.turn)
        if ev.phase in (Phase.PREFILL, Phase.DECODE):
            prev = self._open.get(key)
            if prev is not None and prev[0] is Phase.PREFILL and ev.phase is Phase.DECODE:
                self._add(0, ev.time_s - prev[1], prev[2])
            self._open[key] = (ev.phase, ev.time_s, ev.tokens)
        elif ev.phase is Phase.TOOL or ev.phase.finished:
            prev = self._open.pop(key, None)
            if prev is not None and prev[0] is Phase.DECODE:
                self._add(3, ev.time_s - prev[1], ev.tokens)

    def _add(self, at: int, seconds: float, tokens: int) -> None:
        if seconds >= 0 and tokens > 0:
            self._sums[at] += seconds
            self._sums[at + 1] += tokens
            self._sums[at + 2] += 1

    def rates(self) -> PhaseRates:
        s = self._sums
        return PhaseRates(s[0], int(s[1]), int(s[2]), s[3], int(s[4]), int(s[5]))


def _ratio(predicted: float | None, seen: float | None) -> float:
    """The factor a throughput moves by for `predicted` seconds per token to become `seen`'s."""
    if predicted is None or seen is None or seen <= 0 or predicted <= 0:
        return 1.0
    r = predicted / seen
    if abs(r - 1.0) < DEADBAND:
        return 1.0
    return min(max(r, 1 / MAX_STEP), MAX_STEP)


class Calibration:
    def __init__(self) -> None:
        self.scale = ModelScale()
        self.error: float | None = None
        self.replays = 0  # replays held against the step they replayed
        self._clock = PhaseClock()
        self._began_s = 0.0
        self._last_s = 0.0  # the latest event of the step: its end, once it has ended
        self._split = None  # the split the step opened in
        self._moved = False

    def begin(self, time_s: float, split) -> None:
        self._clock, self._began_s, self._last_s, self._split, self._moved = PhaseClock(), time_s, time_s, split, False

    def observe(self, ev: LifecycleEvent) -> None:
        self._clock.observe(ev)
        self._last_s = max(self._last_s, ev.time_s)

    def moved(self) -> None:
        """A role change mid-step: the step no longer ran one split, and a replay in one is not it."""
        self._moved = True

    def end(self, finished: Sequence[TrajectorySpec], rehearse: Callable[..., float]) -> str:
        """The step that ended (`finished`, as it ran) held against its replay in the split it ran:
        the correction moves toward what was seen and the step is replayed again under it, up to
        ROUNDS replays, until the replay is within DEADBAND of the step. `error` is then the last
        replay's: the corrected model's, which is the one the next decisions use. "" where the step
        cannot be held against a replay (a switch mid-step, too few legs)."""
        if self._moved or self._split is None or not finished:
            return ""
        seen = self._clock.rates()
        if seen.decode_per_token() is None:
            return ""
        seen_s = self._last_s - self._began_s
        first, moved = "", []
        for k in range(ROUNDS):
            events: list[LifecycleEvent] = []
            predicted_s = rehearse(finished, self._split, scale=self.scale, events=events)
            clock = PhaseClock()
            for ev in events:
                clock.observe(ev)
            before = self.scale
            why = self.update(seen, clock.rates(), seen_s, predicted_s, last=k == ROUNDS - 1)
            first = first or why
            if self.scale == before:
                break
            moved.append(str(self.scale))
        return f"{first}; corrected to {moved[-1]}, then {self.error:.1%} off" if moved else first

    def update(self, seen: PhaseRates, predicted: PhaseRates, seen_s: float, predicted_s: float,
               last: bool = False) -> str:
        """Fold one replay in: `error` becomes its makespan's, and unless `last` or the replay is
        within DEADBAND of the step, the correction moves by the leg rates' ratios."""
        if predicted_s <= 0 or seen_s <= 0:
            return ""
        self.replays += 1
        self.error = abs(seen_s / predicted_s - 1.0)
        p = d = 1.0
        if not last and self.error >= DEADBAND:
            p = _ratio(predicted.prefill_per_token(), seen.prefill_per_token())
            d = _ratio(predicted.decode_per_token(), seen.decode_per_token())
            self.scale = self.scale * ModelScale(prefill=p, decode=d)
        return f"step {seen_s:.1f} s against {predicted_s:.1f} s rehearsed ({self.error:.1%} off)"

    def margin(self, floor: float) -> float:
        """The lead a rehearsed split needs over the one kept: the model's measured error once a
        step has measured it (a lead inside it is the model's, not the split's), else `floor`."""
        return floor if self.error is None else max(floor, self.error)
