"""The Prorsa page: a Bokeh document over the scheduler-side LiveState (state.py).

    prorsa_doc(state, extra, doc)   fills the document of one open page; distributed's
                                    BokehApplication calls it for each (plugin.py registers it)

Models carry names (`prorsa-summary`, `prorsa-roles`, `prorsa-demand-prefill`,
`prorsa-demand-decode`, `prorsa-trajectories`, `prorsa-queues`, `prorsa-kv`, `prorsa-switches`)
so a browser or a test finds them with `Bokeh.documents[0].get_model_by_name(...)`.

Every open page reads the state in process on the scheduler's event loop, twice a second, and
sends the browser only what changed: new points are streamed, the small tables replaced.
"""

from __future__ import annotations

import html
import logging

from bokeh.layouts import column, row
from bokeh.models import (ColumnDataSource, DataRange1d, DataTable, Div, FactorRange, HoverTool, Legend, NumberFormatter,
                          NumeralTickFormatter, TableColumn)
from bokeh.plotting import figure

from prorsa.control.forecast_stats import skill
from prorsa.dashboard.state import STATES, LiveState
from prorsa.metrics.palette import FORECAST, ROLE_COLOURS, STATE_COLOURS, UNKNOWN, engine_style, role_colour
from prorsa.metrics.words import metric_words, plain_reason

log = logging.getLogger(__name__)

LIVE_STATES = STATES[:4]  # done and failed only grow: they are in the summary line
UPDATE_MS = 500
X_LABEL = "wall seconds since the rollout began"  # the run's files and report share it
KV_MIN_BAR = 0.01  # a used KV share below this is drawn this wide, so 0.3% still shows


def prorsa_doc(state: LiveState, extra: dict, doc) -> None:
    page = _Page(state)
    doc.title = "Dask: Prorsa"
    doc.add_root(page.root)
    doc.add_periodic_callback(page.update, UPDATE_MS)
    try:  # the dashboard's own look and menu, when distributed's templates are there
        from distributed.dashboard.components.scheduler import BOKEH_THEME, env  # noqa: PLC0415

        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
        doc.theme = BOKEH_THEME
    except Exception:
        log.debug("prorsa dashboard: distributed's template not used", exc_info=True)
    page.update()


class _Page:
    def __init__(self, state: LiveState) -> None:
        self.state = state
        self.engines = list(state.engines)
        self.seen = -1  # state.version drawn
        self.sent_points = 0  # folds already streamed
        self.sent_forecasts = 0
        self.n_switches = -1

        self.summary = Div(name="prorsa-summary", text="waiting for the first control interval",
                           sizing_mode="stretch_width")
        self.roles_src = ColumnDataSource({"engine": [], "left": [], "right": [], "role": [], "color": []})
        self.switch_src = ColumnDataSource({"t": [], "engine": [], "change": [], "reason": [], "drain_s": []})
        self.series_src = ColumnDataSource(self._empty_series())
        self.fc_src = ColumnDataSource({"t": [], "mid": [], "prefill_tps": [], "decode_seqs": []})
        self.kv_src = ColumnDataSource({"engine": [], "kv_use": [], "bar": [], "color": [], "text": []})

        x_range = DataRange1d()  # one time axis for every time plot: pan or zoom one, all follow
        prefill, decode = self._demand_figures(x_range)
        self.root = column(self.summary, self._roles_figure(x_range), row(prefill, decode, sizing_mode="stretch_width"),
                           row(self._trajectories_figure(x_range), self._queues_figure(x_range), self._kv_figure(),
                               sizing_mode="stretch_width"),
                           Div(text="<b>Role switches</b>"), self._switch_table(), sizing_mode="stretch_width")

    def _roles_figure(self, x_range: DataRange1d):
        """One lane per engine, a bar per span of a role, a marker per finished switch."""
        roles = figure(name="prorsa-roles", title="Engine roles (observed) and role switches",
                       height=70 + 28 * len(self.engines), y_range=FactorRange(*reversed(self.engines)),
                       x_range=x_range, x_axis_label=X_LABEL,
                       sizing_mode="stretch_width", tools="xpan,xwheel_zoom,reset", toolbar_location="above")
        roles.hbar(y="engine", left="left", right="right", height=0.7, color="color", source=self.roles_src,
                   legend_field="role")
        marks = roles.scatter(x="t", y="engine", marker="inverted_triangle", size=11, color="black",
                              source=self.switch_src)
        roles.add_tools(HoverTool(renderers=[marks], tooltips=[("switch", "@engine: @change"), ("t", "@t{0.0} s"),
                                                               ("drain", "@drain_s{0.00} s"), ("why", "@reason")]))
        roles.add_layout(roles.legend[0], "right")
        return roles

    def _demand_figures(self, x_range: DataRange1d):
        """What arrived beside what the policy forecast (horizon means, drawn at their centre)."""
        prefill = figure(name="prorsa-demand-prefill", title="Prefill demand: prompt tokens arriving",
                         height=260, x_axis_label=X_LABEL, y_axis_label="tokens per second",
                         sizing_mode="stretch_width", tools="xpan,xwheel_zoom,reset", x_range=x_range)
        prefill.yaxis.formatter = NumeralTickFormatter(format="0.[0]a")  # 200k, not 2.000e+5
        prefill.line("t", "prefill_tps", source=self.series_src, color=ROLE_COLOURS["prefill"], line_width=2,
                     legend_label="later turns")
        prefill.line("t", "prefill_tps_all", source=self.series_src, color=ROLE_COLOURS["prefill"], alpha=0.35,
                     legend_label="first turns too")
        prefill.scatter("mid", "prefill_tps", source=self.fc_src, color=FORECAST, size=5,
                        legend_label="forecast (later turns)")
        decode = figure(name="prorsa-demand-decode", title="Decode demand: sequences decoding", height=260,
                        x_axis_label=X_LABEL, y_axis_label="sequences", sizing_mode="stretch_width",
                        tools="xpan,xwheel_zoom,reset", x_range=x_range)
        decode.line("t", "decode_seqs", source=self.series_src, color=ROLE_COLOURS["decode"], line_width=2,
                    legend_label="realised")
        decode.scatter("mid", "decode_seqs", source=self.fc_src, color=FORECAST, size=5, legend_label="forecast")
        for f in (prefill, decode):
            _legend_beside(f)
        return prefill, decode

    def _trajectories_figure(self, x_range: DataRange1d):
        trajs = figure(name="prorsa-trajectories", title="Trajectories by lifecycle state", height=260,
                       x_axis_label=X_LABEL, y_axis_label="trajectories", sizing_mode="stretch_width",
                       tools="xpan,xwheel_zoom,reset", x_range=x_range)
        areas = trajs.varea_stack([f"s_{s}" for s in LIVE_STATES], x="t", source=self.series_src,
                                  color=[STATE_COLOURS[s] for s in LIVE_STATES])
        trajs.add_layout(Legend(items=[(s, [a]) for s, a in zip(LIVE_STATES, areas)]), "right")
        return trajs

    def _queues_figure(self, x_range: DataRange1d):
        """Engines in colours no role uses (palette.py), so a line is not read as a role."""
        queues = figure(name="prorsa-queues", title="Queue depth per engine", height=260, x_axis_label=X_LABEL,
                        y_axis_label="requests waiting", sizing_mode="stretch_width",
                        tools="xpan,xwheel_zoom,reset", x_range=x_range)
        for i, e in enumerate(self.engines):
            colour, dash = engine_style(i)
            queues.step("t", f"q{i}", source=self.series_src, mode="after", color=colour, line_dash=dash,
                        line_width=1.5, legend_label=e)
        _legend_beside(queues)
        return queues

    def _kv_figure(self):
        kv = figure(name="prorsa-kv", title="KV use per engine (now)", height=70 + 28 * len(self.engines),
                    y_range=FactorRange(*reversed(self.engines)), x_range=(0, 1), sizing_mode="stretch_width",
                    tools="", toolbar_location=None)
        kv.hbar(y="engine", left=0, right=1, height=0.7, fill_color="#f2f2f2", line_color=UNKNOWN,
                source=self.kv_src)  # the capacity, so a nearly empty engine still shows its lane
        kv.hbar(y="engine", right="bar", height=0.7, color="color", source=self.kv_src)
        kv.text(x=0.02, y="engine", text="text", source=self.kv_src, text_baseline="middle", text_font_size="10px")
        kv.xaxis.axis_label = "share of the engine's KV capacity (bar colour: role)"
        kv.xaxis.formatter = NumeralTickFormatter(format="0%")
        return kv

    def _switch_table(self) -> DataTable:
        return DataTable(name="prorsa-switches", source=self.switch_src, height=180, sizing_mode="stretch_width",
                         index_position=None, columns=[
                             TableColumn(field="t", title="t (wall s)", formatter=NumberFormatter(format="0.0"),
                                         width=70),
                             TableColumn(field="engine", title="engine", width=80),
                             TableColumn(field="change", title="switch", width=120),
                             TableColumn(field="drain_s", title="drain (s)", formatter=NumberFormatter(format="0.00"),
                                         width=70),
                             TableColumn(field="reason", title="reason", width=600)])

    def _empty_series(self) -> dict[str, list]:
        cols = ["t", "prefill_tps", "prefill_tps_all", "decode_seqs"]
        cols += [f"q{i}" for i in range(len(self.engines))] + [f"s_{s}" for s in LIVE_STATES]
        return {c: [] for c in cols}

    def update(self) -> None:
        try:
            self._update()
        except Exception:  # a broken draw leaves the page stale; it must not hurt the scheduler
            log.exception("prorsa dashboard: page update failed")

    def _update(self) -> None:
        s = self.state
        if s.version == self.seen:
            return
        self.seen = s.version
        self._stream_points()
        self._stream_forecasts()
        spans = [(e, t0, t1, role) for e, lane in s.roles.items() for t0, t1, role in lane]
        self.roles_src.data = {"engine": [x[0] for x in spans], "left": [x[1] for x in spans],
                               "right": [x[2] for x in spans], "role": [x[3] for x in spans],
                               "color": [role_colour(x[3]) for x in spans]}
        if len(s.switches) != self.n_switches:
            self.n_switches = len(s.switches)
            sw = list(s.switches)
            self.switch_src.data = {"t": [c.t for c in sw], "engine": [c.engine for c in sw],
                                    "change": [f"{c.from_role.value} -> {c.to_role.value}" for c in sw],
                                    "reason": [plain_reason(c.reason) for c in sw], "drain_s": [c.drain_s for c in sw]}
        engines = s.engines
        loads = [e.load for e in engines.values()]
        self.kv_src.data = {"engine": list(engines), "kv_use": [x.kv_use for x in loads],
                            "bar": [max(x.kv_use, KV_MIN_BAR) if x.kv_use > 0 else 0.0 for x in loads],
                            "color": [role_colour(x.role.value) for x in loads],
                            "text": [f"{x.role.value}{' (switching)' if e.switching else ''}  {x.kv_use:.0%}  "
                                     f"{x.active} active, {x.queued} waiting" for x, e in zip(loads, engines.values())]}
        self.summary.text = self._summary()

    def _stream_points(self) -> None:
        rows = _unsent(self.state.points, self.state.version, self.sent_points)
        self.sent_points = self.state.version
        if not rows:
            return
        data = {"t": [p[0] for p in rows], "prefill_tps": [p[1] for p in rows],
                "prefill_tps_all": [p[2] for p in rows], "decode_seqs": [p[3] for p in rows]}
        for i in range(len(self.engines)):
            data[f"q{i}"] = [p[4][i] for p in rows]
        for j, name in enumerate(LIVE_STATES):
            data[f"s_{name}"] = [p[6][j] for p in rows]
        self.series_src.stream(data, rollover=self.state.history)

    def _stream_forecasts(self) -> None:
        rows = _unsent(self.state.forecasts, self.state.n_forecasts, self.sent_forecasts)
        self.sent_forecasts = self.state.n_forecasts
        if rows:
            self.fc_src.stream({"t": [r[0] for r in rows], "mid": [r[0] + r[1] / 2 for r in rows],
                                "prefill_tps": [r[2] for r in rows], "decode_seqs": [r[3] for r in rows]},
                               rollover=self.state.history)

    def _summary(self) -> str:
        s = self.state
        m = s.meta
        c = s.census.counts
        expected = m.get("expected")
        done = f"{c['done']}/{expected}" if expected else str(c["done"])
        roles = ", ".join(f"{n}: {e.load.role.value}{'*' if e.switching else ''}" for n, e in s.engines.items())
        d = s.decision
        why = html.escape(plain_reason(d.reason)) if d is not None and d.reason else "(no decision yet)"
        return (f"<b>{html.escape(str(m.get('name', '')))}</b> &middot; policy <b>{html.escape(str(m.get('policy', '')))}</b>"
                f" &middot; t = {s.t:.1f} s (wall) &middot; trajectories done {done}, failed {c['failed']}, live "
                f"{sum(c[x] for x in LIVE_STATES)} &middot; turns {s.turns:,} &middot; tokens {s.tokens:,}<br>"
                f"roles: {html.escape(roles)} (* switching)<br>last decision: {why}"
                + (f"<br>{skill_line(d.forecast_error)}" if d is not None and d.forecast_error else ""))


def _legend_beside(fig) -> None:
    """The legend right of the plot, not over its data; a click hides a series."""
    legend = fig.legend[0]
    legend.click_policy = "hide"
    legend.label_text_font_size = "9px"
    fig.add_layout(legend, "right")


def skill_line(errors: dict[str, float]) -> str:
    """The forecast's error beside its two baselines', per metric: whether forecasting pays."""
    def pct(v: float) -> str:
        return "n/a" if v != v else f"{100 * v:.0f}%"

    parts = [f"{metric_words(metric)} " + " / ".join(pct(by.get(w, float("nan")))
                                                    for w in ("forecast", "persistence", "ewma"))
             for metric, by in skill(errors).items()]
    return "forecast error, MAPE (prorsa / last interval / EWMA): " + "; ".join(parts)


def _unsent(rows, total: int, sent: int) -> list:
    """The rows of a bounded history a page has not drawn yet: `total` ever appended, `sent`
    drawn; those that fell off the front are gone for it too."""
    new = min(total - sent, len(rows))
    return list(rows)[-new:] if new > 0 else []
