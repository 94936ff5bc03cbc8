"""Task-family profiles: the distributions a synthetic agentic workload is drawn from.

Numbers come from ../shared/FACTS.md, "Workload figures for agentic RL" ([S] stated by a public
source, [D] derived, [E] estimate). Shapes follow its note: turns lognormal truncated at the cap;
appended tokens lognormal (the prompt drawn separately); decode lognormal; tool latency a mixture
of a lognormal body and a Pareto tail capped at the timeout; a per-prompt hardness factor shared by
the GRPO group that scales the turn count and the decode length.

Operations (pure: every draw takes the caller's numpy Generator, nothing here holds state):
    FAMILIES[name]                   the registry, keyed by the names pipeline.yaml uses
    get_family(name)                 lookup with an error that lists the known names
    Family.draw_prompt(rng)          per prompt, shared by a group -> (hardness, prompt tokens)
    Family.draw_turns(rng, hardness, prompt_tokens) -> RawTurns within the family's turn and
                                     decode caps (the context cap is applied by workload.py)

Hardness is lognormal with median 1, so it widens the spread without moving the medians; the
medians quoted below are therefore medians of the whole population, means grow by exp(s^2/2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LogNormal:
    median: float  # exp(mu)
    sigma: float  # of the underlying normal

    def draw(self, rng: np.random.Generator, size: int, scale: float = 1.0) -> np.ndarray:
        return rng.lognormal(np.log(self.median * scale), self.sigma, size)


@dataclass(frozen=True)
class ToolLatency:
    """Lognormal body, with probability `tail_p` a Pareto tail instead; both capped at the timeout."""

    body: LogNormal  # the typical call
    tail_p: float  # share of calls in the heavy tail
    tail_min_s: float  # Pareto scale x_m: the tail starts here
    tail_alpha: float  # Pareto shape; < 2 means a variance dominated by rare calls
    timeout_s: float  # the sandbox kills a call here; it returns as an error observation

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        body = self.body.draw(rng, size)
        tail = self.tail_min_s * (1.0 + rng.pareto(self.tail_alpha, size))  # numpy's is Lomax
        in_tail = rng.random(size) < self.tail_p
        return np.minimum(np.where(in_tail, tail, body), self.timeout_s)


@dataclass(frozen=True)
class RawTurns:
    """One trajectory's draws in the family's own units, before run-level shaping."""

    appended: list[int]  # per turn; [0] is the prompt
    decode: list[int]  # per turn
    tool_s: list[float]  # per turn; the last is 0 (no tool after the final decode)


@dataclass(frozen=True)
class Family:
    name: str  # the key in FAMILIES and in pipeline.yaml
    turns: LogNormal  # turns per trajectory, before hardness
    max_turns: int  # truncation cap of the turn count
    prompt: LogNormal  # turn-0 appended tokens (system + task), shared by a group
    appended: LogNormal  # tokens a tool observation appends (turns >= 1)
    decode: LogNormal  # tokens decoded per turn, before hardness
    max_decode: int  # max_tokens per turn
    tool: ToolLatency
    context_cap: int  # the trajectory ends before its context exceeds this
    hardness_sigma: float  # per-prompt lognormal factor (median 1) on turns and decode
    # Decode scales by hardness ** decode_hardness: 0 leaves decode lengths independent of how long
    # the trajectory runs, as recorded coding agents show (a hard task is more turns, not longer ones).
    decode_hardness: float = 1.0
    # Turn 0's decode, when it has a shape of its own (the first plan of a fixed agent prompt varies
    # little); None: drawn like every other turn's.
    first_decode: LogNormal | None = None

    def draw_prompt(self, rng: np.random.Generator) -> tuple[float, int]:
        """(hardness, prompt tokens) for one prompt: every member of its group shares both."""
        hardness = float(rng.lognormal(0.0, self.hardness_sigma))
        return hardness, max(1, round(float(self.prompt.draw(rng, 1)[0])))

    def draw_turns(self, rng: np.random.Generator, hardness: float, prompt_tokens: int) -> RawTurns:
        """One group member's turns. Draw order is fixed so a seed always gives the same trajectory."""
        n = int(np.clip(round(float(self.turns.draw(rng, 1, hardness)[0])), 1, self.max_turns))
        # Draw n of everything, then set turn 0 / the last turn, so turn k's values do not
        # depend on how the trajectory is later cut (caps keep a prefix of the same draw).
        appended = np.maximum(1, np.rint(self.appended.draw(rng, n))).astype(int)
        decode = np.clip(np.rint(self.decode.draw(rng, n, hardness ** self.decode_hardness)),
                         1, self.max_decode).astype(int)
        tool = self.tool.draw(rng, n)
        appended[0], tool[-1] = prompt_tokens, 0.0
        if self.first_decode is not None:  # drawn last, so every other draw stays where it was
            decode[0] = int(np.clip(round(float(self.first_decode.draw(rng, 1)[0])), 1, self.max_decode))
        return RawTurns([int(a) for a in appended], [int(d) for d in decode], [float(t) for t in tool])


# --- the profiles ---------------------------------------------------------------------------
# Each figure cites the FACTS.md table cell it was fitted to. Realised turn counts come out
# below the drawn ones where the context cap ends long trajectories early (SWE, terminal).

SWE = Family(
    name="swe",
    turns=LogNormal(median=24, sigma=0.7),  # [S] mean 16-64 turns: mean ~31 before the context cap
    max_turns=128,  # [S] max 42-408
    prompt=LogNormal(median=2000, sigma=0.5),  # [E] issue text + agent instructions
    appended=LogNormal(median=800, sigma=1.3),  # [S] median 0.7-1k, p90 3-6k (4.2k), p99 10-31k (16k)
    decode=LogNormal(median=300, sigma=1.0),  # [D] mean ~520 with hardness: 300*exp((1+0.3^2)/2)=517
    max_decode=4096,  # [S] cap 4096
    tool=ToolLatency(
        body=LogNormal(median=0.3, sigma=0.8),  # [S] median 0.1-0.6 s
        tail_p=0.05, tail_min_s=2.0, tail_alpha=1.1,  # [S] heavy tail to minutes ([E] shape)
        timeout_s=60.0,  # [S] 60 s cap
    ),
    context_cap=65536,  # [S] 30-64k
    hardness_sigma=0.3,  # [E]
)

SEARCH = Family(
    name="search",
    turns=LogNormal(median=2.0, sigma=0.5),  # [S] 1-4 searches (Search-R1 style)
    max_turns=4,  # [S] 1-4; deep research (~23, cap 128) would be its own family
    prompt=LogNormal(median=300, sigma=0.4),  # [E] question + instructions
    appended=LogNormal(median=450, sigma=0.3),  # [E] 300-600 per search (p10 306, p90 660)
    decode=LogNormal(median=200, sigma=0.6),  # [E] short reasoning + query, under the cap
    max_decode=512,  # [S] <=512 cap
    tool=ToolLatency(
        body=LogNormal(median=1.0, sigma=0.6),  # [S] web search 0.5-3 s (p10 0.46, p90 2.2)
        tail_p=0.03, tail_min_s=3.0, tail_alpha=1.5,  # [E] slow pages
        timeout_s=30.0,  # [E]
    ),
    context_cap=15000,  # [S] 4-15k
    hardness_sigma=0.3,  # [E]
)

MATH_TIR = Family(
    name="math-tir",
    turns=LogNormal(median=6.0, sigma=0.5),  # [S] 3-16 turns (p5 2.6, p95 13.7)
    max_turns=16,  # [S] 16
    prompt=LogNormal(median=400, sigma=0.5),  # [E] problem statement + tool instructions
    appended=LogNormal(median=200, sigma=1.0),  # [E] <1k: interpreter output (p90 720)
    decode=LogNormal(median=1500, sigma=0.7),  # [E] thinking 1.5-4k per turn
    max_decode=8192,  # [S] up to 8k
    tool=ToolLatency(
        body=LogNormal(median=0.3, sigma=0.7),  # [S] sub-second
        tail_p=0.02, tail_min_s=2.0, tail_alpha=1.5,  # [E] long-running code
        timeout_s=120.0,  # [S] 120 s cap
    ),
    context_cap=24576,  # [S] 16-24k
    hardness_sigma=0.4,  # [E] problem difficulty varies more than repo tasks' turn counts
)

TERMINAL = Family(
    name="terminal",
    turns=LogNormal(median=12.0, sigma=0.8),  # [S] 1-50
    max_turns=50,  # [S] 50
    prompt=LogNormal(median=1500, sigma=0.5),  # [E] task + environment description
    appended=LogNormal(median=1200, sigma=1.1),  # [S] 0.9k-20k (p90 5k, p99 16k)
    decode=LogNormal(median=300, sigma=1.0),  # [E] FACTS gives none: the non-thinking ~300
    max_decode=4096,  # [E]
    tool=ToolLatency(
        body=LogNormal(median=5.0, sigma=1.2),  # [D] task wall mean ~6-7 min [S]: ~4 min of
        tail_p=0.15, tail_min_s=30.0, tail_alpha=1.3,  # tools over ~10 turns, the rest decode;
        timeout_s=600.0,  # the tail is builds and test suites; [E] 10 min per command
    ),
    context_cap=32768,  # [S] 32k per request
    hardness_sigma=0.4,  # [E]
)

# A recorded coding agent (mini-swe-agent on SWE-bench Verified, 500 runs with provider token counts;
# ../shared/traces/README.md [S]): turns mean 40, p90 66, max 145; decode per turn median 89, mean
# 276, p90 681; appended median 98, p90 901; first-turn decode uncorrelated with total decode.
CODING_AGENT = Family(
    name="coding-agent",
    turns=LogNormal(median=35.6, sigma=0.4),  # [D] with hardness: sigma 0.48, mean 40, p90 66
    max_turns=150,  # [S] max 145 in 500 runs
    prompt=LogNormal(median=1400, sigma=0.35),  # [S] system + instance prompt 1.1-3.3k (20 sessions)
    appended=LogNormal(median=98, sigma=1.73),  # [D] median 98, p90 98*exp(1.2816*1.73)=901
    decode=LogNormal(median=89, sigma=1.53),  # [D] between mean 276 (sigma 1.50) and p90 681 (1.57)
    max_decode=16384,  # [E] a provider's per-call cap
    tool=ToolLatency(
        body=LogNormal(median=1.0, sigma=1.0),  # [E] the start-to-start gap (median 4 s, p90 13 s)
        tail_p=0.05, tail_min_s=10.0, tail_alpha=1.3,  # less the model's own time; test runs
        timeout_s=300.0,  # [E] make the tail
    ),
    context_cap=131072,  # [E] a 128k model: long runs end here, as they would on one
    hardness_sigma=0.27,  # [D] sqrt(0.4^2 + 0.27^2) = 0.48, the turn count's spread
    decode_hardness=0.0,  # [S] first-turn vs total decode Spearman 0.01
    first_decode=LogNormal(median=105, sigma=0.3),  # [S] 73-208 over 20 sessions
)

FAMILIES: dict[str, Family] = {f.name: f for f in (SWE, SEARCH, MATH_TIR, TERMINAL, CODING_AGENT)}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown task family {name!r}; known: {', '.join(FAMILIES)}") from None
