"""The Simulator page: open a `gpufleet sim --out` results.json, uploaded or found under the data folder,
and compare its policies side by side with the report's plots."""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Query, Request, UploadFile
from fastapi.responses import RedirectResponse, Response

from gpufleet.server.http_errors import NotFoundError
from gpufleet.server.web.common import WebRoute, render, service_of, url_for, web_session
from gpufleet.server.web.security import WebSession, check_csrf
from gpufleet.server.web.simresults import MAX_RESULTS_BYTES, Results, ResultsError, parse_results

router = APIRouter(route_class=WebRoute, include_in_schema=False)

Session = Annotated[WebSession, Depends(web_session)]
KEPT_UPLOADS = 16  # uploaded results kept in memory, newest first; each is shown only to its uploader
FOUND_MAX = 50
SKIPPED_DIRS = {"jobs", "run", "logs"}  # the executor's folders: job output, never results


class Uploads:
    """Uploaded results, kept in this process so the page can be reloaded (POST, then redirect)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[str, Results]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, owner: str, results: Results) -> str:
        key = secrets.token_urlsafe(12)
        with self._lock:
            self._items[key] = (owner, results)
            while len(self._items) > KEPT_UPLOADS:
                self._items.popitem(last=False)
        return key

    def get(self, owner: str, key: str) -> Results:
        with self._lock:
            found = self._items.get(key)
        if found is None or found[0] != owner:
            raise NotFoundError(
                "no such uploaded results (uploads are kept while the control plane runs)", "upload the file again"
            )
        return found[1]


def _uploads(request: Request) -> Uploads:
    uploads: Uploads = request.app.state.web_uploads
    return uploads


def _data_dir(request: Request) -> Path | None:
    return service_of(request).ctx.data_dir


def found_results(data_dir: Path) -> list[str]:
    """results.json files under the data folder (not inside job folders), as paths relative to it."""
    found: list[str] = []
    root = data_dir.resolve()
    for path in sorted(root.rglob("*.json")):
        relative = path.relative_to(root)
        if relative.parts and relative.parts[0] in SKIPPED_DIRS:
            continue
        if path.name == "results.json" and path.is_file() and len(relative.parts) <= 6:
            found.append(str(relative))
            if len(found) >= FOUND_MAX:
                break
    return found


def _open_path(data_dir: Path, relative: str) -> Results:
    root = data_dir.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or path == root:
        raise NotFoundError(f"{relative!r} is not under the data folder", f"give a path relative to {root}")
    if path.suffix != ".json" or not path.is_file():
        raise NotFoundError(
            f"no results file {relative!r} under the data folder",
            "give the path of a results.json written by `gpufleet sim --out`, relative to the data folder",
        )
    if path.stat().st_size > MAX_RESULTS_BYTES:
        raise ResultsError(f"{relative} is larger than {MAX_RESULTS_BYTES // 2**20} MiB", "open a smaller file")
    return parse_results(path.read_bytes(), relative)


@router.get("/simulator")
def simulator_page(
    request: Request,
    session: Session,
    path: Annotated[str | None, Query(max_length=1000)] = None,
    upload: Annotated[str | None, Query(max_length=40)] = None,
) -> Response:
    data_dir = _data_dir(request)
    results: Results | None = None
    if upload:
        results = _uploads(request).get(session.principal.token.secret_hash, upload)
    elif path:
        # The data folder holds every team's files: opening by path is for admins; anyone may upload.
        session.principal.require_admin("opening results from the data folder")
        if data_dir is None:
            raise NotFoundError("this control plane has no data folder", "upload the file instead")
        results = _open_path(data_dir, path)
    found = found_results(data_dir) if data_dir is not None and session.admin else []
    return render(
        request,
        "simulator.html",
        session,
        title="Simulator",
        page="simulator",
        results=results,
        found=found,
        data_dir=str(data_dir) if data_dir is not None and session.admin else None,
        path=path or "",
        max_mib=MAX_RESULTS_BYTES // 2**20,
    )


@router.post("/simulator")
async def simulator_upload(
    request: Request,
    session: Session,
    results_file: UploadFile,
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    check_csrf(request, session.csrf, csrf)
    raw = await results_file.read(MAX_RESULTS_BYTES + 1)
    results = parse_results(raw, results_file.filename or "the uploaded file")
    key = _uploads(request).add(session.principal.token.secret_hash, results)
    return RedirectResponse(url_for(request, "/simulator", {"upload": key}), status_code=303)
