"""A turn runner for driver tests on the virtual clock: every turn takes 1 s, tool calls none."""

from __future__ import annotations

import asyncio

from prorsa.agent.loop import TurnResult


class SecondPerTurn:
    needs_token_ids = False
    vocab_size = 0

    async def run_turn(self, req):
        await asyncio.sleep(1.0)
        return TurnResult(req.traj_id, req.turn, "e0", "e1", req.appended_tokens, 0, req.decode_tokens)
