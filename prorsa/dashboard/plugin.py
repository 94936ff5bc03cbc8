"""The Prorsa page and its JSON endpoint, added to a running scheduler's dashboard by a plugin.

    DashboardPlugin(meta, started_wall, time_unit, prefix="/")
                            a SchedulerPlugin; register it (client.register_plugin) before the
                            controller's first interval. At start it adds to the scheduler's
                            dashboard, when it has one:
        {prefix}prorsa              the Bokeh page (page.py), and "Prorsa" in the dashboard's menu
        {prefix}json/prorsa.json    the same data as JSON (state.py: LiveState.to_json)
    DashboardPlugin.fold(events, loads, report)    called by lifecycle_plugin.observe_and_publish
    DashboardPlugin.state                          the LiveState both read
    add_to_run(client, recorder, meta, started_wall, time_unit) -> DashboardFeed
                            registers the plugin for a live run and returns the controller's feed
    dashboard_links(cluster) -> (status, page, JSON) URLs

The plugin registers at run time, not through a scheduler preload, so the same plugin object
works on the LocalCluster Prorsa starts and on a scheduler someone else started. The Bokeh app is
a BokehTornado added beside the dashboard's own, the way distributed adds its pages
(distributed.dashboard.scheduler.connect).
"""

from __future__ import annotations

import json
import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

from prorsa.cluster.lifecycle_plugin import engine_loads
from prorsa.dashboard.disconnects import quiet_disconnects
from prorsa.dashboard.feed import PLUGIN_NAME, DashboardFeed
from prorsa.dashboard.state import LiveState
from prorsa.metrics.recorder import RunRecorder

log = logging.getLogger(__name__)

PAGE = "prorsa"
JSON_PATH = "json/prorsa.json"


class _StateHandler(web.RequestHandler):
    def initialize(self, plugin: DashboardPlugin) -> None:
        self.plugin = plugin

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(self.plugin.json_body())


class DashboardPlugin(SchedulerPlugin):
    name = PLUGIN_NAME

    def __init__(self, meta: dict, started_wall: float, time_unit: float = 1.0, prefix: str = "/") -> None:
        self.unit = time_unit if time_unit > 0 else 1.0
        self.meta = {**meta, "time_unit": self.unit}  # the state converts the driver's body seconds by it
        self.started = started_wall
        self.prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
        self.state = LiveState(self.meta)
        self._body: tuple[int, bytes] | None = None  # (state version, the JSON document)

    async def start(self, scheduler) -> None:
        self.state.begin(self._now(), engine_loads(scheduler))
        app = getattr(scheduler, "http_application", None)
        if app is None:
            return
        try:
            app.add_handlers(r".*", [(self.prefix + JSON_PATH, _StateHandler, {"plugin": self})])
            if "dashboard" in scheduler.services and _has_bokeh_dashboard(app):
                quiet_disconnects()  # a scheduler in another process than the run's
                _add_page(scheduler, self)
        except Exception:  # a missing page must not take the run down
            log.exception("prorsa dashboard: could not add the page")

    def json_body(self) -> bytes:
        # Encoded once per interval however often scripts ask: the encoding grows with the
        # history and runs on the event loop the run's driver and scheduler share.
        if self._body is None or self._body[0] != self.state.version:
            self._body = (self.state.version,
                          json.dumps(self.state.to_json(), allow_nan=False, default=float).encode())
        return self._body[1]

    def fold(self, events, loads, report) -> None:
        self.state.fold(self._now(), events, loads, report)

    def _now(self) -> float:
        return time.time() - self.started  # wall: the page shares the run's files' clock (state.py)


def _has_bokeh_dashboard(app) -> bool:
    return any("Bokeh" in type(a).__name__ for a in getattr(app, "applications", []))


def _add_page(scheduler, plugin: DashboardPlugin) -> None:
    from distributed.dashboard.core import BokehApplication  # noqa: PLC0415  (bokeh: only with a dashboard)
    from distributed.dashboard.scheduler import template_variables  # noqa: PLC0415
    from tornado.ioloop import IOLoop  # noqa: PLC0415

    from prorsa.dashboard.page import prorsa_doc  # noqa: PLC0415

    variables = template_variables(scheduler)
    # The menu's page list is shared by every dashboard page of this scheduler (memoised per
    # scheduler), so adding to it puts "Prorsa" in the menu of every page, not only ours.
    if PAGE not in variables["pages"]:
        variables["pages"].append(PAGE)
    bokeh_app = BokehApplication({f"/{PAGE}": lambda s, extra, doc: prorsa_doc(plugin.state, extra, doc)},
                                 scheduler, prefix=plugin.prefix, template_variables=variables)
    scheduler.http_application.add_application(bokeh_app)
    bokeh_app.initialize(IOLoop.current())
    bokeh_app.start()


async def add_to_run(client, recorder: RunRecorder, meta: dict, started_wall: float,
                     time_unit: float = 1.0) -> DashboardFeed:
    """Register the plugin on the run's scheduler; the controller carries the returned feed."""
    await client.register_plugin(DashboardPlugin(meta, started_wall, time_unit))
    return DashboardFeed(recorder, lambda: (time.time() - started_wall) / (time_unit if time_unit > 0 else 1.0))


def dashboard_links(cluster, prefix: str = "/") -> tuple[str, str, str]:
    """(status page, Prorsa page, JSON endpoint) URLs of a cluster's dashboard, from the address
    its HTTP server is bound to: the cluster's own link names the scheduler's host, which is not
    where a dashboard bound to localhost listens."""
    http = getattr(getattr(cluster, "scheduler", None), "http_server", None)
    host = getattr(http, "address", None)
    if http is None or host in (None, "", "0.0.0.0", "::"):
        root = cluster.dashboard_link.split("://", 1)[-1].split("/", 1)[0]
    else:
        root = f"[{host}]:{http.port}" if ":" in host else f"{host}:{http.port}"
    base = f"http://{root}" + ("/" + prefix.strip("/") if prefix.strip("/") else "")
    return f"{base}/status", f"{base}/{PAGE}", f"{base}/{JSON_PATH}"
