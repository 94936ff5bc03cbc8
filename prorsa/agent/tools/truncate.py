"""Cut an observation to a budget of characters or tokens, keeping its head and its tail.

    Truncation(limit, unit="chars"|"tokens", tokenizer=None)   the budget of one observation
    Truncation.apply(text) -> (text, cut)                       cut is True when anything was cut

Both ends are kept because a traceback's last lines and a program's first lines are the parts a
model acts on. `unit="tokens"` needs a tokenizer with `encode(text) -> ids` and
`decode(ids) -> text` (a Hugging Face tokenizer works).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HEAD_SHARE = 0.7  # of the budget kept from the start; the rest from the end


@dataclass(frozen=True)
class Truncation:
    limit: int = 4096  # the most characters (or tokens) an observation keeps, marker excluded
    unit: str = "chars"  # "chars" | "tokens"
    tokenizer: Any = None  # required for unit="tokens"

    def __post_init__(self):
        if self.limit < 1:
            raise ValueError(f"truncation limit must be >= 1, got {self.limit}")
        if self.unit not in ("chars", "tokens"):
            raise ValueError(f"truncation unit must be 'chars' or 'tokens', got {self.unit!r}")
        if self.unit == "tokens" and self.tokenizer is None:
            raise ValueError("truncation by tokens needs a tokenizer")

    def apply(self, text: str) -> tuple[str, bool]:
        units = self.tokenizer.encode(text) if self.unit == "tokens" else text
        if len(units) <= self.limit:
            return text, False
        head_n = int(self.limit * HEAD_SHARE)
        tail_n = self.limit - head_n
        head, tail = units[:head_n], units[len(units) - tail_n:] if tail_n else units[:0]
        if self.unit == "tokens":
            head, tail = self.tokenizer.decode(list(head)), self.tokenizer.decode(list(tail))
        marker = f"\n[... {len(units) - self.limit} {self.unit} cut ...]\n"
        return head + marker + tail, True
