"""The web dashboard at `/`: server-rendered pages (Jinja2) over the API's service layer, a little
JavaScript (htmx for live regions, uPlot for charts, our app.js), every asset in the wheel.

`mount_web(app)` adds the pages, the static files and the path-prefix middleware to the API's app. Pages:
`pages_fleet` (Overview, Queues, Nodes), `pages_jobs` (Jobs, a job), `pages_sim` (Simulator), `pages_auth`
(sign in/out); `security` (sessions and their cookie, CSRF), `common` (templates, links, errors), `fleet` and
`simresults` (what the pages show)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from gpufleet.server.web import pages_auth, pages_fleet, pages_jobs, pages_sim
from gpufleet.server.web.common import STATIC_DIR, compile_templates
from gpufleet.server.web.prefix import ForwardedPrefix
from gpufleet.server.web.security import CsrfKeys, WebSessions


def mount_web(app: FastAPI) -> None:
    compile_templates()
    app.state.web_csrf = CsrfKeys(app.state.service.store)
    app.state.web_sessions = WebSessions()
    app.state.web_uploads = pages_sim.Uploads()
    for module in (pages_auth, pages_fleet, pages_jobs, pages_sim):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_middleware(ForwardedPrefix)


__all__ = ["mount_web"]
