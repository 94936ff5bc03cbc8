"""The Prorsa page in a real browser: headless Chromium loads it while a run goes, the role and
demand plots are there, and they move between two screenshots (kept as artifacts)."""

import io
import os
import time
from pathlib import Path

import pytest
from PIL import Image, ImageChops

ROLES, PREFILL, DECODE = "prorsa-roles", "prorsa-demand-prefill", "prorsa-demand-decode"
NAMES = (ROLES, PREFILL, DECODE, "prorsa-trajectories", "prorsa-queues", "prorsa-kv", "prorsa-switches",
         "prorsa-summary")

# What the page holds, read from its Bokeh document: each named model's place on the page, and
# the data the role and demand plots draw.
READ = """(() => {
  const doc = Bokeh.documents[0];
  const out = {boxes: {}, lanes: 0, role_end: 0, demand_points: 0, roles: [], labels: {}, switch_rows: 0, changes: 0};
  for (const name of %s) {
    const model = doc.get_model_by_name(name);
    const view = model && Bokeh.index.find_one(model);
    if (!view) continue;
    const r = view.el.getBoundingClientRect();
    out.boxes[name] = {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height};
    if (model.below && model.left)  // a plot: the words on its axes, as drawn
      out.labels[name] = [model.below[0].axis_label || '', model.left[0].axis_label || ''];
  }
  const switches = doc.get_model_by_name('prorsa-switches');
  if (switches) out.switch_rows = Object.values(switches.source.data)[0].length;
  const roles = doc.get_model_by_name('%s');
  if (roles) {
    const data = roles.renderers[0].data_source.data;
    out.lanes = new Set(Array.from(data.engine)).size;
    out.role_end = Math.max(0, ...Array.from(data.right));
    out.roles = Array.from(new Set(Array.from(data.role)));
    const lanes = {};  // each engine's spans in time order: a role change is two spans in a row that differ
    Array.from(data.engine).forEach((e, i) => (lanes[e] = lanes[e] || []).push([data.left[i], data.role[i]]));
    for (const spans of Object.values(lanes)) {
      spans.sort((a, b) => a[0] - b[0]);
      for (let i = 1; i < spans.length; i++) out.changes += spans[i][1] !== spans[i - 1][1] ? 1 : 0;
    }
  }
  const prefill = doc.get_model_by_name('%s');
  if (prefill) out.demand_points = prefill.renderers[0].data_source.data.t.length;
  return out;
})()""" % (list(NAMES), ROLES, PREFILL)


def artifact_dir() -> Path:
    root = Path(os.environ.get("PRORSA_TEST_ARTIFACTS") or Path(os.environ.get("TMPDIR", "/tmp")) / "prorsa-test-artifacts")
    out = root / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    return out


def changed_share(a: bytes, b: bytes) -> float:
    """Share of pixels that differ between two PNGs of one region."""
    ia, ib = Image.open(io.BytesIO(a)).convert("RGB"), Image.open(io.BytesIO(b)).convert("RGB")
    assert ia.size == ib.size
    diff = ImageChops.difference(ia, ib).convert("L").point(lambda v: 255 if v > 16 else 0)
    return diff.histogram()[255] / (ia.size[0] * ia.size[1])


@pytest.mark.slow  # about 35 s: a 14 s run, Chromium's start and two looks at the page
def test_page_in_headless_chromium_shows_roles_and_demand_moving(live_run, chromium, capsys):
    run = live_run("browser", "concurrency: 96, duration_s: 14")
    page, _ = run.urls()
    chromium.call("Page.enable")
    chromium.call("Runtime.enable")
    chromium.call("Page.navigate", url=page)
    chromium.wait_for("typeof Bokeh !== 'undefined' && Bokeh.documents.length > 0 && "
                      f"Bokeh.documents[0].get_model_by_name('{ROLES}') !== null")
    first = chromium.wait_for(f"(() => {{ const s = {READ}; return s.demand_points >= 3 ? s : null; }})()")
    assert set(first["boxes"]) == set(NAMES), first["boxes"]
    assert all(b["width"] > 100 and b["height"] > 40 for b in first["boxes"].values()), first["boxes"]
    assert first["lanes"] == 4 and set(first["roles"]) <= {"prefill", "decode", "mixed"}
    assert set(first["labels"]) >= {PREFILL, DECODE, "prorsa-trajectories", "prorsa-queues"}, first["labels"]
    assert all(x for name in (PREFILL, DECODE) for x in first["labels"][name]), first["labels"]  # both axes in words
    title = chromium.eval("document.title")
    assert title == "Dask: Prorsa"
    shots = {"page-1": chromium.screenshot()}
    clips = {name: chromium.screenshot(first["boxes"][name]) for name in (ROLES, PREFILL, DECODE)}

    time.sleep(3.0)  # about fifteen control intervals
    second = chromium.eval(READ)
    shots["page-2"] = chromium.screenshot()
    moved = {name: changed_share(clips[name], chromium.screenshot(first["boxes"][name]))
             for name in (ROLES, PREFILL, DECODE)}

    out = artifact_dir()
    for name, png in shots.items():
        (out / f"{name}.png").write_bytes(png)
    with capsys.disabled():
        print(f"\ndashboard screenshots: {out}")
    assert second["role_end"] > first["role_end"] and second["demand_points"] > first["demand_points"]
    # An engine that changed role is listed in the switch table. Several roles alone prove no
    # switch (the opening split may hold prefill beside mixed), and a finished switch reaches the
    # table one control interval after the role lanes (the driver's part rides on the next call).
    if second["changes"] > 0:
        listed = chromium.wait_for(f"(() => {{ const s = {READ}; return s.switch_rows >= s.changes ? s : null; }})()",
                                   timeout=5.0)
        assert listed["switch_rows"] >= listed["changes"] > 0, listed
    assert all(share > 0.002 for share in moved.values()), moved
    assert shots["page-1"] != shots["page-2"]
    assert not chromium.errors, chromium.errors
    run.wait()

