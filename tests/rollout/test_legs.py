"""A turn's sampling reaches its decode leg: its own, else the default (the pipeline's is filled in
by the live runner before the legs are made)."""

from prorsa.agent.loop import TurnRequest
from prorsa.rollout.legs import leg_requests
from prorsa.rollout.router import Route
from prorsa.sampling import Sampling

TURN = TurnRequest("t0", 0, "swe", 100, 100, 20, 0.0, True, 7, token_ids=tuple(range(100)))


def test_a_turn_s_sampling_and_seed_reach_its_decode_leg():
    asked = Sampling(temperature=0.0, top_p=0.5, stop=("\n",), seed=3)
    for route in (Route("engine-0", "engine-1"), Route(None, "engine-1")):
        pre, dec = leg_requests(TurnRequest(**{**TURN.__dict__, "sampling": asked}), route)
        assert dec.sampling == asked and dec.seed == 7
        assert (pre is None) == (route.prefill is None)
    _, dec = leg_requests(TURN, Route(None, "engine-1"))
    assert dec.sampling == Sampling()
