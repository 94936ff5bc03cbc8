"""The prior held against the run on all five means, with what is still running as a bound."""

from prorsa.control.policy import WorkloadHint
from prorsa.control.prior_check import PRIOR_SAMPLES, PRIOR_TOLERANCE, TOOL_TOLERANCE, Censored, contradiction

# a terminal run's means: tool calls of 22 s; SWE's appends, prompts and decodes look alike
TERMINAL = WorkloadHint(concurrency=256, prompt_tokens=2000, observation_tokens=1000, decode_tokens=480,
                        tool_s=22.0, turns=12.0)
SWE_SEEN = {"prompt_tokens": 2100.0, "observation_tokens": 1100.0, "decode_tokens": 450.0, "tool_s": 0.9}


def test_short_tool_calls_count_against_the_prior_once_most_started_have_ended():
    settled = Censored(tools_running=10, tool_elapsed_s=5.0, tools_ended=90, tool_ended_s=81.0)
    assert contradiction(TERMINAL, SWE_SEEN, settled) == "prior dropped: tool_s 0.9 observed against its 22; "


def test_short_tool_calls_do_not_count_while_many_are_still_running():
    """The first calls to end are the short ones: 40 ended of 100 says little of the mean."""
    early = Censored(tools_running=60, tool_elapsed_s=30.0, tools_ended=40, tool_ended_s=36.0)
    assert contradiction(TERMINAL, SWE_SEEN, early) == ""


def test_a_right_prior_holds_while_its_heavy_tail_is_still_running():
    """Three seconds into a SWE step on SWE's own prior: 68 calls ended at 0.35 s, 15 running 0.48 s
    in. The calls still running could hold the tail (5% past 2 s) that makes the 0.93 s mean."""
    swe = WorkloadHint(concurrency=128, prompt_tokens=1900, observation_tokens=1800, decode_tokens=500,
                       tool_s=0.93, turns=7.0)
    live = Censored(tools_running=15, tool_elapsed_s=7.13, tools_ended=68, tool_ended_s=23.73)
    assert contradiction(swe, {"tool_s": 23.73 / 68}, live) == ""
    # the same calls, long ended: they no longer leave room for the prior's mean
    ended = Censored(tools_ended=83, tool_ended_s=23.73 + 15 * 0.5)
    assert contradiction(swe, {"tool_s": ended.tool_ended_s / 83}, ended).startswith("prior dropped: tool_s")
    assert ended.tool_ended_s / 83 * PRIOR_TOLERANCE < swe.tool_s


def test_long_tool_calls_still_running_are_a_lower_bound_that_drops_the_prior():
    """SWE's prior (0.9 s tools) on a terminal run: nothing has ended, yet the calls under way have
    already lasted more than twice its mean."""
    swe = WorkloadHint(concurrency=256, prompt_tokens=2000, observation_tokens=1000, decode_tokens=480,
                       tool_s=0.9, turns=12.0)
    running = Censored(tools_running=PRIOR_SAMPLES, tool_elapsed_s=PRIOR_SAMPLES * 5.0)
    assert contradiction(swe, {}, running) == "prior dropped: tool_s at least 5 so far against its 0.9; "
    assert contradiction(swe, {}, Censored(tools_running=PRIOR_SAMPLES - 1, tool_elapsed_s=99.0)) == ""


def test_tool_time_a_few_times_the_priors_is_the_bodys_lag_not_another_family():
    """A right prior's calls, seen live with the body's lag, at twice its mean and more: kept,
    until they pass TOOL_TOLERANCE (terminal's are 24x SWE's)."""
    swe = WorkloadHint(concurrency=128, prompt_tokens=2000, observation_tokens=1000, decode_tokens=480,
                       tool_s=0.93, turns=7.0)
    lagged = Censored(tools_running=20, tool_elapsed_s=20 * 2.0, tools_ended=80, tool_ended_s=80 * 1.9)
    assert contradiction(swe, {"tool_s": 1.9}, lagged) == ""
    assert contradiction(swe, {"tool_s": TOOL_TOLERANCE * 0.93 * 1.01}).startswith("prior dropped: tool_s")


def test_turns_count_when_longer_as_ended_or_as_reached():
    assert contradiction(TERMINAL, {"turns": 30.0}).startswith("prior dropped: turns 30 ")
    assert contradiction(TERMINAL, {"turns": 3.0}) == ""  # the short ones end first
    reached = Censored(trajectories_running=20, turns_reached=20 * 25, trajectories_ended=0)
    assert contradiction(TERMINAL, {}, reached) == "prior dropped: turns at least 25 so far against its 12; "


def test_a_matching_run_keeps_its_prior():
    seen = {"prompt_tokens": 1900.0, "observation_tokens": 950.0, "decode_tokens": 500.0, "tool_s": 20.0,
            "turns": 11.0}
    live = Censored(tools_running=5, tool_elapsed_s=50.0, tools_ended=95, tool_ended_s=1900.0,
                    trajectories_running=100, turns_reached=600, trajectories_ended=20, turns_ended=220)
    assert contradiction(TERMINAL, seen, live) == ""


def test_a_bound_exactly_at_the_tolerance_keeps_the_prior_as_an_observed_mean_does():
    """At PRIOR_TOLERANCE times the prior's 12 turns, 24 so far, the prior holds (as an ended mean
    of exactly 24 does); a turn more in all and it is dropped."""
    at = Censored(trajectories_running=16, turns_reached=16 * 24)
    assert PRIOR_TOLERANCE == 2.0 and contradiction(TERMINAL, {"turns": 24.0}, at) == ""
    past = Censored(trajectories_running=16, turns_reached=16 * 24 + 1)
    assert contradiction(TERMINAL, {}, past) == "prior dropped: turns at least 24.1 so far against its 12; "
