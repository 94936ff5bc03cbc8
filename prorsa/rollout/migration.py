"""Moving a trajectory's context while its tool runs (scheduling.migrate), off its own path.

    relocate(traj_id, route, context, remaining)   -> an engine to warm with the trajectory's
                                context while its tool runs (its next turn goes there), or None

The warm-up is priced by the cost rule's books (cost_rule.py) but not as a move at routing is:
the trajectory does not wait for it, so only what it makes the engine's other turns wait counts.
"""

from __future__ import annotations

from prorsa.rollout.cost_rule import CostRule
from prorsa.rollout.engine_pools import Route
from prorsa.rollout.stickiness import Stickiness


class Migration(CostRule, Stickiness):
    def relocate(self, traj_id: str, route: Route, context: int, remaining: float | None = None) -> str | None:
        """Where the trajectory of `route`'s turn should find its `context` tokens cached at its
        next turn (scheduling.migrate): an engine of the same kind as the one holding them now,
        when waiting there beats staying by more than the warm-up costs the engine's other
        sequences, or None to stay. Called as the turn's decode ends, `route` still counted in
        flight; `remaining`: the decode tokens the trajectory is predicted to have left.

        The warm-up (the context prefilled there while the tool runs) is off the trajectory's own
        path, so unlike a move at routing (_cost_choice) its own recompute is not charged: only
        what it makes the engine's other turns wait, every turn it holds on a mixed engine (the
        decodes co-batched with it and the turns queued behind), on a prefill engine the next
        prefill behind it. An idle engine takes it for free. Decode-local turns and decode legs
        are not moved: their context is pulled or kept where the decode runs."""
        if self.move_cost is None or route.local_prefill or context <= 0:
            return None
        pools = self._pool()
        if route.prefill is None:
            leg, kind, eligible, prev = "decode", "whole", pools.mixed or pools.decoders, route.decode
        else:
            leg, kind, eligible, prev = "prefill", "prefill", pools.prefillers, route.prefill
        if prev not in eligible.members or len(eligible) < 2:
            return None
        now = self.clock()
        # the next turn's wait, not the whole remainder's: the loads it is priced on last about a
        # turn (pricing the remainder moved 5x as often and lost up to 9% on contended cells)
        mean = self.move_cost.decode_tokens
        decode = mean if remaining is None else min(remaining, mean)
        own_kv = route.kv if leg == "decode" else 0

        def wait(e: str, load: int, kv: int) -> float:
            return self._price(e).wait_s(kind, load, self.backlog(e, now), kv, decode)

        stay = wait(prev, self.load[prev] - 1, self._kv[prev] - own_kv)  # this turn will have ended
        best, best_s = None, stay
        extra: dict[int, float] = {}  # the warm-up's price, once per cost model (one for equal engines)
        for e in eligible:
            if e == prev:
                continue
            price = self._price(e)
            if id(price) not in extra:
                extra[id(price)] = price.move_s(kind, context, 0)
            # every turn it holds, admitted or queued, waits out the warm-up's prefill
            stalled = self.load[e] if kind == "whole" else 1
            total = wait(e, self.load[e], self._kv[e]) + extra[id(price)] * stalled
            if total < best_s:
                best, best_s = e, total
        if best is not None:
            self._sticky[leg][traj_id] = best
            self._backlog[best] = self.backlog(best, now) + context
        return best
