"""The Prorsa page on the Dask dashboard, fed by the live controller.

    state.py    LiveState: what the page shows, kept on the scheduler; Report: the driver's part
    feed.py     DashboardFeed (driver side): the report that rides on the controller's one
                scheduler call per interval (cluster/lifecycle_plugin.py: observe_and_publish)
    plugin.py   DashboardPlugin: registers the page ({prefix}prorsa) and the JSON endpoint
                ({prefix}json/prorsa.json) on the scheduler's dashboard
    page.py     the Bokeh document

Only plugin.py and page.py import Bokeh, and only on the scheduler.
"""
