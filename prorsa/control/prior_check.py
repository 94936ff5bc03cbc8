"""Is the prior this run's workload? Its five means held against what the run has shown.

    contradiction(prior, seen[, live]) -> str   why the means `seen` (and the trajectories still
                                   running, `live`) say `prior` is not this run's workload; "" while
                                   it may be
    opening_contradiction(prior, prompts) -> str   the same from the prompts a run opens with
    Censored(...)                  what the running trajectories bound: tool calls under way, turns
                                   reached so far

Every mean is seen from what has ended, and what ends first is short: the first decodes, tool
calls and trajectories to end are the short ones. So a mean observed shorter than the prior's
counts against it only for the tool calls, and only while it stays short with every call still
running granted the prior's view of it: its time so far and PRIOR_TOLERANCE of the prior's mean
more (tool time is heavy-tailed: a call that has lasted is likely to last). A longer mean always
counts, also as a bound: a tool call still running
has lasted at least its time so far, a trajectory still running has at least the turns it has
reached, and a mean over those lower bounds that is already past the prior's tolerance cannot come
back. Without tool time and turns a terminal run's prior passed as a SWE run's (prompts, appends
and decodes alike; tool time 22 s against 0.9 s) and held SWE MoE sync at 0.928 of the best fixed
split (benchmarks/priors.py --table wrong). Counting the ended calls alone once three quarters of
those started had ended dropped a right prior 3 s into a SWE step (pipelines/moe-step.yaml): 68
calls had ended at a mean of 0.35 s against the prior's 0.93, the 15 still running 0.48 s in, and
SWE's tail (5% of calls past 2 s, Pareto 1.1) holds most of the mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prorsa.control.policy import WorkloadHint

PRIOR_SAMPLES = 16  # observations of a mean before it is held against the prior's
PRIOR_TOLERANCE = 2.0  # an observed mean this many times off the prior's (either way) drops it
# ... but tool time longer than the prior's only this many times over: families' tool means differ
# 3x (search, math-tir) to 24x (terminal, SWE), and a run's tool calls carry its body's own lag: a
# right prior made in the simulator, held live on emulated engines on a loaded 2-core machine
# (pipelines/moe-step.yaml), saw its calls at least 2.04x its mean 22 s in (the simulator: 1.04x)
TOOL_TOLERANCE = 4.0


@dataclass(frozen=True)
class Censored:
    """What the trajectories still running bound, as the policy's tracker sees them."""

    tools_running: int = 0  # tool calls under way
    tool_elapsed_s: float = 0.0  # their time so far, summed
    tools_ended: int = 0  # tool calls that ended
    tool_ended_s: float = 0.0  # their time, summed
    trajectories_running: int = 0
    turns_reached: int = 0  # turns the running ones have begun, summed
    trajectories_ended: int = 0
    turns_ended: int = 0  # turns the ended ones ran, summed


def contradiction(prior: WorkloadHint, seen: dict[str, float], live: Censored | None = None) -> str:
    """Why the means `seen` say `prior` is not this run's workload, "" while it may be. Appends
    are counted as they are queued, so theirs count both ways; decodes, turns and tool calls as
    they end, so only the longer counts, and tool time the shorter too where even the calls still
    running, granted the prior's view of them, leave it short (`_tool_short`)."""
    live = live or Censored()
    for key, low in (("prompt_tokens", 1 / PRIOR_TOLERANCE), ("observation_tokens", 1 / PRIOR_TOLERANCE),
                     ("decode_tokens", 0.0), ("turns", 0.0), ("tool_s", 0.0)):
        mine, told = seen.get(key), getattr(prior, key)
        high = TOOL_TOLERANCE if key == "tool_s" else PRIOR_TOLERANCE
        if mine is not None and told > 0 and not low <= mine / told <= high:
            return f"prior dropped: {key} {_num(mine)} observed against its {_num(told)}; "
    return _tool_short(prior, seen, live) or _bounded(prior, live)


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _tool_short(prior: WorkloadHint, seen: dict[str, float], live: Censored) -> str:
    """The tool calls' mean short of the prior's tolerance, each call still running counted at its
    time so far and PRIOR_TOLERANCE of the prior's mean more: an upper estimate by the prior's own
    account, so what stays short of it is short."""
    mine, told = seen.get("tool_s"), prior.tool_s
    n = live.tools_ended + live.tools_running
    if mine is None or told <= 0 or not n:
        return ""
    high = (live.tool_ended_s + live.tool_elapsed_s + live.tools_running * PRIOR_TOLERANCE * told) / n
    if high * PRIOR_TOLERANCE < told:
        return f"prior dropped: tool_s {_num(mine)} observed against its {_num(told)}; "
    return ""


def _bounded(prior: WorkloadHint, live: Censored) -> str:
    """A lower bound of a mean, counting what is still running at its time so far, past the
    prior's tolerance: the run's mean can only be longer."""
    for key, total, n, told, high in (
            ("tool_s", live.tool_ended_s + live.tool_elapsed_s, live.tools_ended + live.tools_running, prior.tool_s,
             TOOL_TOLERANCE),
            ("turns", live.turns_ended + live.turns_reached, live.trajectories_ended + live.trajectories_running,
             prior.turns, PRIOR_TOLERANCE)):
        if n >= PRIOR_SAMPLES and told > 0 and total / n > high * told:
            return f"prior dropped: {key} at least {_num(total / n)} so far against its {_num(told)}; "
    return ""


def opening_contradiction(prior: WorkloadHint, prompts: Sequence[int]) -> str:
    """Why the prompts a run opens with (the batch in hand, their tokens counted before any
    prefill) say `prior` is not this run's workload, "" while it may be. A wrong family's prior
    otherwise opens the run on its own split and is dropped only a second in, once the engines it
    set up hold the first decodes: drivers.py's synchronous turns and EP16 SWE cells, run on
    math-tir's prior, opened all mixed and ended at 0.85-0.92 of the best fixed split, and at
    0.99-1.00 set aside here (benchmarks/priors.py --table drivers)."""
    if len(prompts) < PRIOR_SAMPLES:
        return ""
    return contradiction(prior, {"prompt_tokens": sum(prompts) / len(prompts)})
