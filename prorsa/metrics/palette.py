"""One colour scheme for every figure and the dashboard, so a role reads the same everywhere.

    ROLE_COLOURS     prefill / decode / mixed (Okabe-Ito: safe for colour-blind readers)
    PHASE_COLOURS    a turn's phases; prefill and decode share their role's colour
    STATE_COLOURS    a trajectory's live lifecycle states
    engine_style(i)  (colour, dash) of engine i's series: colours no role uses, dashes past six
    BAR_COLOURS      makespan and throughput bars; FORECAST the forecasts' markers
    SERIES           the lines of a figure that are not roles (runs, metrics, policies), in order
"""

from __future__ import annotations

ROLE_COLOURS = {"prefill": "#D55E00", "decode": "#0072B2", "mixed": "#CC79A7"}
UNKNOWN = "#BBBBBB"
PHASE_COLOURS = {"queue_s": "#999999", "prefill_s": ROLE_COLOURS["prefill"], "transfer_s": "#E69F00",
                 "decode_s": ROLE_COLOURS["decode"], "tool_s": "#009E73"}
STATE_COLOURS = {"queued": "#BBBBBB", "prefill": "#F4A582", "decode": "#92C5DE", "tool": "#009E73"}
BAR_COLOURS = {"makespan": "#56B4E9", "throughput": "#009E73"}
FORECAST = "#000000"
_ENGINES = ("#009E73", "#000000", "#8C564B", "#BCBD22", "#17BECF", "#7F7F7F")
_DASHES = ("solid", "dashed", "dotted", "dashdot")


def engine_style(i: int) -> tuple[str, str]:
    return _ENGINES[i % len(_ENGINES)], _DASHES[(i // len(_ENGINES)) % len(_DASHES)]


def role_colour(role: str) -> str:
    return ROLE_COLOURS.get(role, UNKNOWN)


# Lines that are not roles (runs, metrics, policies), in order: Okabe-Ito, as the roles are
SERIES = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
