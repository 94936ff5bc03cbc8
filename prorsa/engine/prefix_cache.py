"""The emulated engine's prefix cache: which trajectories' contexts are still in its KV memory.

    make_prefix_cache(kind, capacity) -> IdealCache | LruCache
    cache.take(traj_id, now_used) -> tokens     a request starts here: its cached prefix moves into
                                                the request's own KV (it is not evictable meanwhile)
    cache.put(traj_id, tokens, now_used)        a request finished: its context stays cached
    cache.clear()                               a weight update invalidates every prefix
    cache.evicted_tokens                        tokens dropped to make room, since start

ideal   every context stays cached forever (an upper bound on reuse)
lru     cached contexts share the KV that running requests do not hold (capacity - used); when a
        context comes back or a request grows, the least recently used idle contexts are dropped.
        A trajectory waiting on a long tool call loses its context first, and its next turn
        prefills the whole context again: the single most consequential modelling choice for
        disaggregation (a prefill engine holds only what it prefilled, see README)
"""

from __future__ import annotations

from collections import OrderedDict


class IdealCache:
    kind = "ideal"

    def __init__(self, capacity: int = 0) -> None:
        self._held: dict[str, int] = {}
        self.evicted_tokens = 0

    def take(self, traj_id: str, used: int) -> int:
        return self._held.get(traj_id, 0)

    def put(self, traj_id: str, tokens: int, used: int) -> None:
        self._held[traj_id] = tokens

    def clear(self) -> None:
        self._held.clear()

    @property
    def tokens(self) -> int:
        return 0  # holds nothing that running requests could need


class LruCache:
    kind = "lru"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # the engine's KV tokens, shared with running requests
        self._held: OrderedDict[str, int] = OrderedDict()  # oldest first
        self.tokens = 0  # cached (idle) context tokens
        self.evicted_tokens = 0

    def take(self, traj_id: str, used: int) -> int:
        self._fit(used)
        tokens = self._held.pop(traj_id, 0)
        self.tokens -= tokens
        return tokens

    def put(self, traj_id: str, tokens: int, used: int) -> None:
        old = self._held.pop(traj_id, 0)
        self._held[traj_id] = tokens
        self.tokens += tokens - old
        self._fit(used)

    def clear(self) -> None:
        self._held.clear()
        self.tokens = 0

    def _fit(self, used: int) -> None:
        while self._held and self.tokens + used > self.capacity:
            _, tokens = self._held.popitem(last=False)
            self.tokens -= tokens
            self.evicted_tokens += tokens


def make_prefix_cache(kind: str, capacity: int) -> IdealCache | LruCache:
    if kind == "ideal":
        return IdealCache(capacity)
    if kind == "lru":
        return LruCache(capacity)
    raise ValueError(f"prefix cache must be 'ideal' or 'lru', got {kind!r}")
