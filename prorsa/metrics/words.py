"""Numbers and the policy's reasons as a reader sees them (report tables, figure labels, dashboard).

    number(value) -> str        four significant figures, thousands separated, no float noise;
                                "n/a" for None and NaN
    plain_reason(reason) -> str a decision's reason with the allocator's shorthand spelled out
    metric_words(name) -> str   a forecast metric's name (decode_seqs, prefill_tps_ewma) in words
"""

from __future__ import annotations

import math
import numbers
import re


def number(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    x = float(value)
    if not math.isfinite(x):
        return "n/a" if x != x else ("inf" if x > 0 else "-inf")
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}" if abs(x) >= 1 else f"{x:.3g}"


_NEG_ZERO = re.compile(r"(?<![\w.])-(0(?:\.0+)?)(?![\d.])")
_NO_GAIN = re.compile(r"\bgains? 0(?:\.0+)?\b(?: seq-s)?")


def plain_reason(reason: str) -> str:
    """'P1 D3 gains -0.0, needs 2x switch 0.50 + 5%' -> 'P1 D3 gains nothing, needs 2x switch ...':
    no negative zeros, no zero gains, 'seq-s' as sequence-seconds."""
    text = _NEG_ZERO.sub(r"\1", reason)
    text = _NO_GAIN.sub(lambda m: "gains nothing" if m.group(0).startswith("gains") else "no gain", text)
    return text.replace(" seq-s", " sequence-s")


_METRICS = {"decode_seqs": "decoding sequences", "prefill_tps": "prefill tokens/s"}
_BASELINES = {"ewma": "EWMA baseline", "persistence": "last-interval baseline",
              "lifecycle": "lifecycle model before the blend"}


def metric_words(name: str) -> str:
    for suffix, words in _BASELINES.items():
        if name.endswith(f"_{suffix}"):
            return f"{metric_words(name.removesuffix('_' + suffix))}, {words}"
    return _METRICS.get(name, name.replace("_", " "))
