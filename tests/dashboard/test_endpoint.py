"""The JSON endpoint on a short live run (emulated engines, time-scaled): its schema while the run
goes, that it moves, and that it agrees with what the run wrote afterwards."""

import json
import time
import urllib.request

import xarray as xr

from prorsa.report.figures import switches
from prorsa.metrics.outputs import ROLE_CODES
from prorsa.report.rundata import load_run

TOP = {"version", "t", "run", "engines", "trajectories", "turns", "tokens", "decision", "roles", "switches",
       "series", "forecasts", "cost"}
RUN = {"name", "policy", "engines", "slots", "kv_capacity", "time_unit", "expected", "clock"}
ENGINE = {"role": str, "switching": bool, "queued": int, "active": int, "kv_tokens": int, "kv_capacity": int,
          "kv_use": (int, float), "legs_prefill": int, "legs_decode": int, "queued_prefill_tokens": int}
STATES = {"queued", "prefill", "decode", "tool", "done", "failed"}
ROLES = {"prefill", "decode", "mixed"}
ENGINES = ["engine-0", "engine-1", "engine-2", "engine-3"]


def get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers["Content-Type"], r.read()


def check_schema(d: dict) -> None:
    assert set(d) == TOP and d["version"] == 1
    assert set(d["run"]) == RUN and d["run"]["engines"] == ENGINES and d["run"]["policy"].startswith("prorsa")
    assert d["run"]["time_unit"] == 0.1 and d["run"]["expected"] == 64
    assert list(d["engines"]) == ENGINES
    for e in d["engines"].values():
        assert set(e) == set(ENGINE) and all(isinstance(e[k], t) for k, t in ENGINE.items())
        assert e["role"] in ROLES and 0 <= e["kv_use"] <= 1 and e["kv_capacity"] > 0
    assert set(d["trajectories"]) == STATES and all(v >= 0 for v in d["trajectories"].values())
    s = d["series"]
    n = len(s["t"])
    assert s["t"] == sorted(s["t"])  # empty until the first control interval
    assert len(s["prefill_tps"]) == len(s["prefill_tps_all"]) == len(s["decode_seqs"]) == n
    assert all(a <= b + 1e-9 for a, b in zip(s["prefill_tps"], s["prefill_tps_all"]))  # later turns are a part
    assert list(s["queued"]) == list(s["kv_use"]) == ENGINES and set(s["trajectories"]) == STATES
    assert all(len(v) == n for v in [*s["queued"].values(), *s["kv_use"].values(), *s["trajectories"].values()])
    f = d["forecasts"]
    assert set(f) == {"t", "horizon_s", "prefill_tps", "decode_seqs"} and len({len(v) for v in f.values()}) == 1
    assert set(d["roles"]) == set(ENGINES)
    for spans in d["roles"].values():
        assert all(t0 <= t1 and role in ROLES for t0, t1, role in spans)
        assert all(a[1] == b[0] and a[2] != b[2] for a, b in zip(spans, spans[1:]))  # contiguous, one per role held
    for c in d["switches"]:
        assert set(c) == {"t", "engine", "from", "to", "reason", "drain_s"} and c["from"] != c["to"]
    if d["decision"] is not None:
        assert set(d["decision"]) == {"t", "reason", "forecast", "forecast_error"}
    assert d["cost"]["folds"] >= n and d["cost"]["fold_s"] >= 0


def test_json_endpoint_while_a_run_goes(live_run):
    run = live_run("dash", "concurrency: 64, trajectories: 64")
    page, data = run.urls()
    docs = []
    deadline = time.time() + 240
    while run.proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)  # as a script would poll; a tight loop would starve the run's event loop
        try:
            status, ctype, body = get(data)
        except OSError:  # the run ended between poll() and the request
            break
        assert status == 200 and ctype.startswith("application/json")
        docs.append(json.loads(body))  # strict JSON: no NaN or Infinity
        if len(docs) == 3:  # the page is there too, under the same dashboard
            status, ctype, body = get(page)
            assert status == 200 and ctype.startswith("text/html") and b"bokeh" in body.lower()
            assert get(page.rsplit("/", 1)[0] + "/status")[0] == 200  # the printed dashboard address works
    run_dir = run.wait()

    assert len(docs) >= 5, run.output()
    for d in docs:
        check_schema(d)
    first, last = docs[0], docs[-1]
    assert last["t"] > first["t"] and last["cost"]["folds"] > first["cost"]["folds"]
    assert len(last["series"]["t"]) > len(first["series"]["t"])
    assert last["turns"] > 0 and last["tokens"] > 0
    assert any(d["forecasts"]["t"] for d in docs) and any(d["decision"] for d in docs)  # prorsa forecasts
    assert max(d["trajectories"]["done"] for d in docs) > 0
    assert max(sum(d["series"]["decode_seqs"]) for d in docs) > 0

    # what the page showed is what the run recorded (the page may miss the last moments)
    ds = xr.open_dataset(run_dir / "metrics.nc")
    codes = {code: role.value for role, code in ROLE_CODES.items()}
    recorded = {(round(float(t), 6), str(e), codes[int(a)], codes[int(b)]) for t, e, a, b in
                zip(ds.switch_time_s.values, ds.switch_engine.values, ds.switch_from.values, ds.switch_to.values)}
    shown = {(round(c["t"], 6), c["engine"], c["from"], c["to"]) for c in last["switches"]}
    assert shown <= recorded
    # and the report puts them at the same times: one clock, wall seconds, on the page and in the files
    reported = {(round(c.t, 6), c.engine, c.from_role.value, c.to_role.value) for c in switches(load_run(run_dir))}
    assert reported == recorded and last["run"]["clock"].startswith("wall seconds") and ds.attrs["clock"] == "wall"
    for c in last["switches"]:  # a finished switch shows in the swimlane: the engine held the new role
        assert c["to"] in {role for _, _, role in last["roles"][c["engine"]]}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert last["trajectories"]["done"] <= summary["trajectories_completed"] == 64
