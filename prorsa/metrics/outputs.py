"""A run directory, written from a RunRecorder:

    trajectories.parquet   one row per trajectory: ids, status, reward (and the task behind it),
                           token ids and logprobs, and a list of per-turn structs (tokens,
                           engines, timings, the real tool call's name, status and observation)
    metrics.nc             xarray Dataset: per-engine time series (role, queue, active, KV) and
                           per-trajectory times; role changes and the forecast behind each;
                           per control interval, the roles the policy saw, the forecast's figures
                           and its error (MAPE per horizon bin). Every time is on one clock, the
                           run's (attribute `clock`): wall seconds since the rollout began live,
                           body seconds in the simulator; the controller stamps its records in
                           body seconds (wall / time_scale), so a live run's are converted here
    summary.json           the headline figures (summary.py RunSummary, built by summarise; a
                           resumed run's over every session, resumed_figures)

write_run(run_dir, rec, summary, makespan_s) writes them for either body (the simulator's
sim/run.py write_run, the live run's live/run.py write_live_run, each with its own summary).
Every file is written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xarray as xr

from prorsa.agent.loop import TrajectoryResult
from prorsa.control.forecast import ForecastSummary
from prorsa.metrics.recorder import RunRecorder
from prorsa.metrics.summary import RunSummary
from prorsa.roles import Role
from prorsa.sampling import Sampling

ROLE_CODES = {Role.PREFILL: 0, Role.DECODE: 1, Role.MIXED: 2}

_CLOCK = "seconds since the rollout began, on the run's clock (summary.json `clock`)"


def _f(name: str, type_: pa.DataType, description: str, unit: str = "") -> pa.Field:
    """A column with its description (and unit) in the Parquet schema's field metadata."""
    return pa.field(name, type_, metadata={"description": description} | ({"unit": unit} if unit else {}))


_TURN = pa.struct([
    _f("turn", pa.int32(), "turn index, from 0"),
    _f("prefill_engine", pa.string(), "engine that prefilled the turn"),
    _f("decode_engine", pa.string(), "engine that decoded the turn"),
    _f("prefill_tokens", pa.int32(), "tokens appended and prefilled this turn", "tokens"),
    _f("cached_tokens", pa.int32(), "context tokens served by a prefix cache", "tokens"),
    _f("decode_tokens", pa.int32(), "tokens generated this turn", "tokens"),
    _f("recomputed_tokens", pa.int32(), "context tokens prefilled again (prefix not cached there)", "tokens"),
    _f("token_ids", pa.list_(pa.int32()), "generated token ids"),
    _f("logprobs", pa.list_(pa.float32()), "log-probability of each generated token", "nats"),
    _f("start_s", pa.float64(), f"when the turn was sent: {_CLOCK}", "s"),
    _f("end_s", pa.float64(), f"when the turn ended: {_CLOCK}", "s"),
    _f("queue_s", pa.float64(), "waiting for admission", "s"),
    _f("prefill_s", pa.float64(), "prefilling", "s"),
    _f("transfer_s", pa.float64(), "moving the KV to the decode engine", "s"),
    _f("decode_s", pa.float64(), "decoding", "s"),
    _f("tool_s", pa.float64(), "in the tool", "s"),
    # environments only ("" and null when the tool was a replayed latency)
    _f("tool_name", pa.string(), "the tool called (empty: a replayed latency)"),
    _f("tool_status", pa.string(), "the tool call's status (empty: a replayed latency)"),
    _f("observation", pa.string(), "the tool's observation text"),
    _f("observation_tokens", pa.int32(), "tokens of the observation", "tokens"),
    _f("policy_version", pa.int32(), "weights version the turn was sent under"),
    _f("sampling", pa.struct([
        _f("temperature", pa.float32(), "0: greedy"), _f("top_p", pa.float32(), "nucleus share"),
        _f("top_k", pa.int32(), "-1: every token"), _f("min_p", pa.float32(), "share of the likeliest token's"),
        _f("presence_penalty", pa.float32(), "OpenAI's"), _f("frequency_penalty", pa.float32(), "OpenAI's"),
        _f("repetition_penalty", pa.float32(), "vLLM's; 1: none"), _f("seed", pa.int64(), "the request's own"),
        _f("stop", pa.list_(pa.string()), "strings that end the reply")]),
       "how the turn's tokens were drawn: the pipeline's sampling:, or a served request's"),
])
TRAJECTORY_SCHEMA = pa.schema([
    _f("traj_id", pa.string(), "trajectory id"),
    _f("family", pa.string(), "task family"),
    _f("step", pa.int32(), "synchronous step (async: batch) it belongs to"),
    _f("prompt_index", pa.int32(), "prompt within the step"),
    _f("group_index", pa.int32(), "sample within the prompt's GRPO group"),
    _f("status", pa.string(), "completed or failed; partial rollouts: cancelled (cut at a step's end) or stale "
       "(dropped by max_staleness)"),
    _f("error", pa.string(), "the failure's message"),
    _f("reward", pa.float64(), "reward (NaN: none)", "reward"),
    _f("reward_error", pa.string(), "the reward function's error, if it raised"),
    _f("task_id", pa.string(), "the environment's task"),
    _f("policy_version", pa.int32(), "weights version it started under (its oldest turn's)"),
    _f("trained_step", pa.int32(), "partial rollouts: the step whose batch trained it (null: not trained "
       "there, or no partial rollouts)"),
    _f("start_s", pa.float64(), f"when it started: {_CLOCK}", "s"),
    _f("end_s", pa.float64(), f"when it ended: {_CLOCK}", "s"),
    _f("n_turns", pa.int32(), "turns played", "turns"),
    _f("prompt_ids", pa.list_(pa.int32()), "prompt token ids"),
    _f("response_ids", pa.list_(pa.int32()), "every generated token id, turns concatenated"),
    _f("response_logprobs", pa.list_(pa.float32()), "their log-probabilities", "nats"),
    _f("turns", pa.list_(_TURN), "one struct per turn"),
    _f("metadata", pa.string(), "prorsa serve: what the client attached as it ended the conversation (JSON)"),
])


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def trajectory_row(r: TrajectoryResult) -> dict[str, Any]:
    turns = [
        {k: getattr(t, k) for k in _TURN.names if k not in ("token_ids", "logprobs", "sampling")}
        | {"token_ids": list(t.token_ids), "logprobs": list(t.logprobs), "sampling": _sampling_row(t.sampling)}
        for t in r.turns
    ]
    return {
        "traj_id": r.spec.traj_id, "family": r.spec.family, "step": r.spec.step,
        "prompt_index": r.spec.prompt_index, "group_index": r.spec.group_index,
        "status": r.status, "error": r.error, "reward": r.reward, "reward_error": r.reward_error,
        "task_id": r.task_id, "policy_version": r.policy_version, "trained_step": r.trained_step,
        "start_s": r.start_s, "end_s": r.end_s, "n_turns": len(r.turns),
        "prompt_ids": list(r.prompt_ids),
        "response_ids": [i for t in r.turns for i in t.token_ids],
        "response_logprobs": [x for t in r.turns for x in t.logprobs],
        "turns": turns,
        "metadata": None if r.metadata is None else json.dumps(r.metadata),
    }


def _sampling_row(s: Sampling | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {k: getattr(s, k) for k in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                       "frequency_penalty", "repetition_penalty", "seed")} | {"stop": list(s.stop)}


def write_trajectories(path: Path, results: list[TrajectoryResult]) -> None:
    table = pa.Table.from_pylist([trajectory_row(r) for r in results], schema=TRAJECTORY_SCHEMA)
    _atomic(path, lambda tmp: pq.write_table(table, tmp))


def metrics_dataset(rec: RunRecorder, attrs: dict[str, Any], time_scale: float = 1.0,
                    simulated: bool = False) -> xr.Dataset:
    """`time_scale`: wall seconds per body second of a live run (emulated engines time-scaled);
    `simulated`: every time is body seconds (the simulator has no wall clock)."""
    scale = 1.0 if simulated or time_scale <= 0 else float(time_scale)  # body -> the run's clock
    times = sorted({s.t for s in rec.samples})
    t_index = {t: i for i, t in enumerate(times)}
    e_index = {e: j for j, e in enumerate(rec.engines)}
    shape = (len(times), len(rec.engines))
    grids = {k: np.full(shape, -1 if k == "role" else 0, dtype=np.int64)
             for k in ("role", "queued", "active", "kv_tokens", "kv_capacity")}
    for s in rec.samples:
        i, j = t_index[s.t], e_index[s.load.engine_id]
        grids["role"][i, j] = ROLE_CODES[s.load.role]
        for k in ("queued", "active", "kv_tokens", "kv_capacity"):
            grids[k][i, j] = getattr(s.load, k)
    trajs = sorted(rec.trajectories, key=lambda r: r.spec.traj_id)
    changes = rec.role_changes
    ds = xr.Dataset(
        {
            **{k: (("time", "engine"), v) for k, v in grids.items()},
            "traj_start_s": ("trajectory", np.array([r.start_s for r in trajs], dtype=float)),
            "traj_end_s": ("trajectory", np.array([r.end_s for r in trajs], dtype=float)),
            "traj_turns": ("trajectory", np.array([len(r.turns) for r in trajs], dtype=np.int64)),
            "traj_completed": ("trajectory", np.array([r.status == "completed" for r in trajs])),
            "switch_time_s": ("switch", np.array([c.t * scale for c in changes], dtype=float)),
            "switch_engine": ("switch", np.array([c.engine for c in changes], dtype=str)),
            "switch_from": ("switch", np.array([ROLE_CODES[c.from_role] for c in changes], dtype=np.int64)),
            "switch_to": ("switch", np.array([ROLE_CODES[c.to_role] for c in changes], dtype=np.int64)),
            "switch_drain_s": ("switch", np.array([c.drain_s * scale for c in changes], dtype=float)),
            "switch_reason": ("switch", np.array([c.reason for c in changes], dtype=str)),
            "switch_forecast": ("switch", np.array([json.dumps(_figures(c.forecast)) for c in changes], dtype=str)),
            **_control_vars(rec, scale),
        },
        coords={
            "time": np.array(times, dtype=float),
            "engine": np.array(rec.engines, dtype=str),
            "trajectory": np.array([r.spec.traj_id for r in trajs], dtype=str),
        },
        attrs={**attrs, "role_codes": json.dumps({r.value: c for r, c in ROLE_CODES.items()})},
    )
    _describe(ds, simulated)
    ds.attrs.update(clock=BODY_CLOCK if simulated else WALL_CLOCK, time_scale=scale,
                    time_scale_meaning="wall seconds per body (cost-model) second; body = wall / time_scale")
    return ds


WALL_CLOCK = "wall"  # metrics.nc `clock`: every time in wall seconds since the rollout began
BODY_CLOCK = "body (simulated)"  # every time in the simulator's body seconds
_ROLE_CODE = {"flag_values": np.array(sorted(ROLE_CODES.values()), dtype=np.int64),
              "flag_meanings": " ".join(r.value for r in sorted(ROLE_CODES, key=ROLE_CODES.get))}
_BODY = "body seconds (the cost model's clock: wall seconds / time_scale)"
# variable -> (units, long_name); {clock} is the run's clock, which every time is on
_UNITS: dict[str, tuple[str, str]] = {
    "time": ("s", "when the engines were sampled: {clock} since the rollout began"),
    "role": ("1", "each engine's role (flag_meanings; -1: not sampled)"),
    "queued": ("requests", "requests waiting for admission"),
    "active": ("sequences", "sequences admitted (prefilling or decoding)"),
    "kv_tokens": ("tokens", "KV tokens written by admitted sequences (contexts and tokens decoded so far)"),
    "kv_capacity": ("tokens", "KV tokens the engine can hold"),
    "traj_start_s": ("s", "when the trajectory started: {clock} since the rollout began"),
    "traj_end_s": ("s", "when the trajectory ended: {clock} since the rollout began"),
    "traj_turns": ("turns", "turns the trajectory played"),
    "traj_completed": ("1", "whether the trajectory completed"),
    "switch_time_s": ("s", "when the switch was asked for: {clock} since the rollout began"),
    "switch_from": ("1", "the engine's role before the switch (flag_meanings)"),
    "switch_to": ("1", "the engine's role after the switch (flag_meanings)"),
    "switch_drain_s": ("s", "from the request to the engine serving its new role, {clock}"),
    "control_t": ("s", "when the policy decided: {clock} since the rollout began"),
    "control_role": ("1", "each engine's role as the policy saw it (flag_meanings; -1: not seen)"),
    "control_forecast": ("1", "the forecast and plan figures behind each decision, each in its own unit "
                              f"(forecast_figure names it; horizons in {_BODY}; NaN: none)"),
    "forecast_mape": ("1", "mean absolute percentage error of the forecast, per metric@horizon bin "
                           f"(0.1 = 10%; horizon bins in {_BODY})"),
}

_TEXT = {
    "engine": "engine (Dask worker) name", "trajectory": "trajectory id",
    "switch_engine": "the engine that switched",
    "switch_reason": f"the policy's reason for the switch (its figures in {_BODY})",
    "switch_forecast": "the forecast behind the switch: JSON of figure -> value (forecast_figure's units)",
    "control_reason": f"the policy's reason at each decision (its figures in {_BODY})",
    "forecast_figure": "name of each forecast and plan figure", "forecast_bin": f"metric@horizon bin, horizon in {_BODY}",
}


def _describe(ds: xr.Dataset, simulated: bool) -> None:
    """CF-style units and long names on every numeric variable, naming the clock each time is on;
    long names on the text ones (CF gives text no units)."""
    clock = "body seconds (simulated)" if simulated else "wall seconds"
    for name, (units, long_name) in _UNITS.items():
        if name in ds.variables:
            ds[name].attrs.update(units=units, long_name=long_name.format(clock=clock))
    for name, long_name in _TEXT.items():
        if name in ds.variables:
            ds[name].attrs["long_name"] = long_name
    for name in ("role", "switch_from", "switch_to", "control_role"):
        ds[name].attrs.update(_ROLE_CODE)


def _figures(forecast: ForecastSummary | None) -> dict[str, float]:
    return {} if forecast is None else forecast.figures()


def _control_vars(rec: RunRecorder, scale: float) -> dict[str, Any]:
    """Per control interval: when (body seconds x `scale`: the run's clock), the roles seen, the
    forecast's figures and its error per metric and horizon bin."""
    keys = sorted({k for c in rec.controls for k in c.forecast_error})
    mape = _table(rec.controls, keys, lambda c: c.forecast_error)
    figures = sorted({k for c in rec.controls for k in _figures(c.forecast)})
    roles = np.full((len(rec.controls), len(rec.engines)), -1, dtype=np.int64)
    e_index = {e: j for j, e in enumerate(rec.engines)}
    for i, c in enumerate(rec.controls):
        for engine, role in c.roles.items():
            if engine in e_index:
                roles[i, e_index[engine]] = ROLE_CODES[role]
    return {
        "control_t": ("control", np.array([c.t * scale for c in rec.controls], dtype=float)),
        "control_reason": ("control", np.array([c.reason for c in rec.controls], dtype=str)),
        "control_role": (("control", "engine"), roles),
        "control_forecast": (("control", "forecast_figure"), _table(rec.controls, figures, lambda c: _figures(c.forecast))),
        "forecast_figure": ("forecast_figure", np.array(figures, dtype=str)),
        "forecast_mape": (("control", "forecast_bin"), mape),
        "forecast_bin": ("forecast_bin", np.array(keys, dtype=str)),
    }


def _table(controls, keys: list[str], row) -> np.ndarray:
    out = np.full((len(controls), len(keys)), np.nan)
    for i, c in enumerate(controls):
        values = row(c)
        for j, k in enumerate(keys):
            out[i, j] = values.get(k, np.nan)
    return out


def write_dataset(path: Path, ds: xr.Dataset) -> None:
    # The data is in memory. xarray still asks dask's default scheduler for a write lock, and a
    # default left to a distributed Client that has gone (a notebook's, a finished sweep's)
    # would fail the write at the very end of a run.
    with dask.config.set(scheduler="synchronous"):
        _atomic(path, lambda tmp: ds.to_netcdf(tmp, engine="netcdf4"))


def summarise(rec: RunRecorder, makespan_s: float, policy: str, config_hash: str, name: str) -> dict[str, Any]:
    """RunSummary's figures, then the environment's (tool calls, reward) when the run had one."""
    done = [r for r in rec.trajectories if r.status == "completed"]
    per_s = (lambda x: x / makespan_s) if makespan_s > 0 else (lambda x: None)
    return RunSummary(
        name=name, policy=policy, config_hash=config_hash, makespan_s=round(makespan_s, 4),
        trajectories_expected=rec.expected, trajectories_completed=rec.completed,
        trajectories_failed=rec.failed, trajectories_dropped=rec.dropped, trajectories_per_s=per_s(len(done)),
        turns=rec.turns, prefill_tokens=rec.prefill_tokens, cached_tokens=rec.cached_tokens,
        recomputed_tokens=rec.recomputed_tokens, prefix_hit_rate=rec.prefix_hit_rate(),
        decode_tokens=rec.decode_tokens, tokens_per_s=per_s(rec.prefill_tokens + rec.decode_tokens),
        decode_tokens_per_s=per_s(rec.decode_tokens), role_switches=len(rec.role_changes),
        forecast_mape=_last_mape(rec),
        mean_trajectory_s=float(np.mean([r.end_s - r.start_s for r in done])) if done else None,
    ).as_dict() | _environment_figures(rec)


def resumed_figures(trajectories: Path, makespan_s: float) -> dict[str, Any]:
    """A resumed run's headline figures over all its sessions: turns and tokens of every saved
    trajectory (one that a killed session left unfinished ran again, and counts once), rates over
    the sessions' summed rollout seconds (`makespan_s`)."""
    t = pq.read_table(trajectories, columns=["status", "start_s", "end_s", "turns"])
    turns = pc.list_flatten(t["turns"])

    def total(name: str) -> int:
        return int(pc.sum(pc.struct_field(turns, name)).as_py() or 0) if len(turns) else 0

    prefill, cached, recomputed, decode = map(total, ("prefill_tokens", "cached_tokens", "recomputed_tokens",
                                                       "decode_tokens"))
    done = pc.equal(t["status"], "completed")
    spans = pc.subtract(pc.filter(t["end_s"], done), pc.filter(t["start_s"], done))
    per_s = (lambda x: x / makespan_s) if makespan_s > 0 else (lambda x: None)
    return {"makespan_s": round(makespan_s, 4), "trajectories_per_s": per_s(len(spans)), "turns": len(turns),
            "prefill_tokens": prefill, "cached_tokens": cached, "recomputed_tokens": recomputed,
            "prefix_hit_rate": round(cached / (cached + recomputed), 4) if cached + recomputed else None,
            "decode_tokens": decode, "tokens_per_s": per_s(prefill + decode), "decode_tokens_per_s": per_s(decode),
            "mean_trajectory_s": pc.mean(spans).as_py() if len(spans) else None}


def _environment_figures(rec: RunRecorder) -> dict[str, Any]:
    """Real tool calls by status and the mean reward; nothing for a run without an environment."""
    statuses: dict[str, int] = {}
    for r in rec.trajectories:
        for t in r.turns:
            if t.tool_status:
                statuses[t.tool_status] = statuses.get(t.tool_status, 0) + 1
    rewards = [r.reward for r in rec.trajectories if np.isfinite(r.reward)]
    errors = [r.reward_error for r in rec.trajectories if r.reward_error]
    if not statuses and not rewards and not errors:
        return {}
    return {"tool_calls": dict(sorted(statuses.items())),
            "reward_mean": round(float(np.mean(rewards)), 4) if rewards else None} | (
               {"reward_errors": len(errors), "reward_error_first": errors[0][:300]} if errors else {})


def _last_mape(rec: RunRecorder) -> dict[str, float] | None:
    """The forecaster's error over its recent window at the last interval, averaged per metric."""
    errors = next((c.forecast_error for c in reversed(rec.controls) if c.forecast_error), None)
    if not errors:
        return None
    by_metric: dict[str, list[float]] = {}
    for k, v in errors.items():
        if np.isfinite(v):
            by_metric.setdefault(k.split("@")[0], []).append(v)
    return {m: round(float(np.mean(v)), 4) for m, v in by_metric.items()}


# summary.json figure -> its unit; "s" on the run's clock (`clock`: wall live, body simulated)
SUMMARY_UNITS = {
    "makespan_s": "s", "mean_trajectory_s": "s", "sim_wall_s": "s (wall, to simulate)",
    "trajectories_expected": "trajectories", "trajectories_completed": "trajectories",
    "trajectories_failed": "trajectories", "trajectories_dropped": "trajectories (partial rollouts: cancelled "
    "or stale, untrained)", "trajectories_resumed": "trajectories",
    "trajectories_per_s": "trajectories/s", "turns": "turns", "turns_retried": "turns", "turns_migrated": "turns",
    "legs_rescued": "legs",
    "prefill_tokens": "tokens", "cached_tokens": "tokens", "recomputed_tokens": "tokens", "decode_tokens": "tokens",
    "tokens_per_s": "tokens/s", "decode_tokens_per_s": "tokens/s", "prefix_hit_rate": "1 (share)",
    "role_switches": "switches", "forecast_mape": "1 (0.1 = 10%)", "reward_mean": "reward",
    "reward_errors": "trajectories whose reward function raised (their reward NaN)",
    "time_scale": "wall seconds per body second", "tool_calls": "calls, by status",
    "control": "intervals and plugin_calls: counts; every other figure: wall seconds",
    "tail_merges": "per merge (scheduling.tail_layout): t s, width engines in each wide one, wide engines, "
                   "predicted_s [as it stood, merged] s",
}


def write_run(run_dir: Path, rec: RunRecorder, summary: dict[str, Any], makespan_s: float, *,
              simulated: bool = False, time_scale: float = 1.0, trajectories: bool = False) -> None:
    """The files of a run directory, whichever body ran it: metrics.nc and summary.json (its
    name, policy and hash read from `summary`), and with `trajectories` trajectories.parquet (a live
    run's journal writes its own as they land). `simulated`: body seconds throughout; `time_scale`:
    a live run's wall seconds per body second."""
    run_dir.mkdir(parents=True, exist_ok=True)
    attrs = {"name": summary["name"], "policy": summary["policy"], "config_hash": summary["config_hash"],
             "makespan_s": makespan_s} | ({"clock": "body (simulated)"} if simulated else {})
    if trajectories:
        write_trajectories(run_dir / "trajectories.parquet", rec.trajectories)
    write_dataset(run_dir / "metrics.nc", metrics_dataset(rec, attrs, time_scale=time_scale, simulated=simulated))
    write_summary(run_dir / "summary.json", summary)


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """With a `units` block naming the unit of every figure it holds (and the time scale, 1 for a
    simulated run, so a reader never has to guess the clock)."""
    out = dict(summary)
    if str(out.get("clock", "")).startswith("body"):
        out.setdefault("time_scale", 1.0)
    out["units"] = {k: u for k, u in SUMMARY_UNITS.items() if k in out} | {"clock": _clock_words(out.get("clock"))}
    _atomic(path, lambda tmp: tmp.write_text(json.dumps(out, indent=2) + "\n"))


def _clock_words(clock) -> str:
    if str(clock).startswith("body"):
        return "times are body seconds (the cost model's clock) since the rollout began"
    return "times are wall seconds since the rollout began"
