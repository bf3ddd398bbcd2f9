"""The web viewer's ASGI app: a JSON API under ``/api/`` and the page that uses it.

Theory of operation: one store opened read-only for the app's lifetime;
every API request first calls ``store.refresh()`` (at most every
:data:`REFRESH_SECONDS`), so the viewer follows a live writer's commits,
then reads under one lock (a local viewer has one user; reads are short).
Every route is a GET: nothing here can write to the store. Values leave as
JSON built by :mod:`.encode`; the page puts them into the DOM as text only,
and the Content-Security-Policy forbids inline scripts besides.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import health
from ..effects import STATUSES
from ..errors import CheckpointNotFoundError, Error, RunNotFoundError
from ..types import BlobRef, TreeRef
from ..views import (
    checkpoint_row,
    effect_counts,
    effect_row,
    first_checkpoint,
    fork_map,
    graph_rows,
    jsonable,
    outbox,
    problems_by_run,
    problems_first,
    resolve_command,
    value_changes,
)
from .encode import preview, tree

STATIC = os.path.join(os.path.dirname(__file__), "static")

#: A request refreshes the store's view if the last refresh is older than this.
REFRESH_SECONDS = 0.25

#: Checkpoints per page of a run's tree.
PAGE = 50
#: The runs page counts each run's checkpoints up to this many ("200+" beyond).
COUNT_LIMIT = 200

_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Viewer:
    """The open store and the reads the API makes of it."""

    def __init__(self, store: Any, path: str, refresh_seconds: float) -> None:
        self.store = store
        self.path = path
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._refreshed = 0.0

    def read(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(store)`` on an up-to-date view, one request at a time."""
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed >= self.refresh_seconds:
                self.store.refresh()
                self._refreshed = now
            return fn(self.store)

    # -- the API's answers -------------------------------------------------------------

    def summary(self, s: Any) -> dict[str, Any]:
        st = s.stats()
        entries = s.effects()
        return {"path": self.path, "store_id": st["store_id"], "visible_lsn": st["visible_lsn"],
                "runs": len(s.runs()), "effects": effect_counts(entries),
                "statuses": list(STATUSES),
                "outbox": len(outbox(entries))}

    def runs(self, s: Any, q: str) -> list[dict[str, Any]]:
        doubt = problems_by_run(s.effects())
        rows = []
        for run in s.runs():
            if q and q.lower() not in run.lower():
                continue
            # Bounded: a run's checkpoints are counted up to COUNT_LIMIT (the store has no
            # count), so the page costs at most that many reads per run.
            recent = s.history(run, limit=COUNT_LIMIT + 1)
            head = recent[0] if recent else None
            first = (recent[-1] if len(recent) <= COUNT_LIMIT
                     else first_checkpoint(s, run, head))
            rows.append({"run": run, "head": head.id if head else None,
                         "created_at": head.created_at if head else None,
                         "checkpoints": min(len(recent), COUNT_LIMIT),
                         "checkpoints_more": len(recent) > COUNT_LIMIT,
                         "in_doubt": doubt.get(run, 0),
                         "origin": list(first.origin) if first and first.origin else None})
        rows.sort(key=lambda r: r["created_at"] or 0, reverse=True)
        return rows

    def checkpoints(self, s: Any, run: str, before: int | None) -> dict[str, Any]:
        head = s.head(run)
        if head is None:
            raise RunNotFoundError(run)
        page = s.history(run, limit=PAGE + 1, before=before)
        more = len(page) > PAGE
        page = page[:PAGE]
        rows = graph_rows(page, fork_map(s), run, head.id)
        for r in rows:
            r["created_at"] = next(c.created_at for c in page if c.id == r["id"])
        return {"run": run, "head": head.id, "rows": rows,
                "next_before": page[-1].id if more and page else None}

    def checkpoint(self, s: Any, run: str, cid: int) -> dict[str, Any]:
        state = s.state(run, at=cid)  # raises run_not_found / checkpoint_not_found
        head = s.head(run)
        c = head if head.id == cid else s.history(run, limit=1, before=cid + 1)[0]
        if c.id != cid:
            raise CheckpointNotFoundError(run, cid)
        blob_url = f"/api/runs/{_q(run)}/blob?at={cid}&key="
        for k, v in state.items():  # a tree (txn.put_tree) shows as its file listing
            if isinstance(v, TreeRef):
                state[k] = {"$tree": v.sha256, "files": {
                    f.path: (f"-> {f.target}" if f.kind == "link" else
                             f"{f.mode:04o}, {f.size} bytes")
                    for f in s.list_tree(run, k, at=cid)}}
        row = checkpoint_row(c)
        row["created_at"] = c.created_at
        return {"checkpoint": row, "state": {k: tree(v, blob_url + _q(k)) for k, v in
                                             sorted(state.items())}}

    def diff(self, s: Any, run: str, a: int, b: int) -> dict[str, Any]:
        d = s.diff(run, a, b)
        return {"run": run, "a": a, "b": b,
                "added": {k: preview(v) for k, v in sorted(d.added.items())},
                "removed": {k: preview(v) for k, v in sorted(d.removed.items())},
                "changed": {k: [_preview_change(c) for c in value_changes(old, new)]
                            for k, (old, new) in sorted(d.changed.items())}}

    def effects(self, s: Any, run: str | None, status: str | None) -> list[dict[str, Any]]:
        return [self._effect(e) for e in problems_first(s.effects(run=run, status=status))]

    def outbox(self, s: Any) -> list[dict[str, Any]]:
        return [self._effect(e) for e in outbox(s.effects())]

    def health(self, s: Any) -> dict[str, Any]:
        """What `agentwal inspect` says: attention first, then the facts."""
        return dict(jsonable(health.inspect(s, self.path)))

    def verify(self, s: Any) -> dict[str, Any]:
        """``store.verify()`` of the view, as `agentwal verify --json` prints it, timed."""
        started = time.monotonic()
        report = s.verify()
        return {"ok": report.ok, "problems": [dataclasses.asdict(p) for p in report.problems],
                "checked": report.checked, "notes": report.notes,
                "seconds": round(time.monotonic() - started, 3),
                "visible_lsn": s.stats()["visible_lsn"]}

    def _effect(self, e: Any) -> dict[str, Any]:
        row = effect_row(e)
        row["args"] = preview(e.args)
        row["result"] = preview(e.result)
        row["resolve"] = resolve_command(self.path, e)
        return row


def _preview_change(c: dict[str, Any]) -> dict[str, Any]:
    out = dict(c)
    for field in ("old", "new"):
        if field in c:
            out[field] = preview(c[field])
    if "items" in c:
        out["items"] = [preview(v) for v in c["items"][:100]]
        out["items_total"] = len(c["items"])
    return out


def _q(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _BadRequest(f"{name} must be a whole number, not {raw!r}") from None
    if value < 1:
        raise _BadRequest(f"{name} must be 1 or more")
    return value


class _BadRequest(Exception):
    pass


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers=_SECURITY_HEADERS)


def create_app(store: Any, path: str, *, refresh_seconds: float = REFRESH_SECONDS) -> Starlette:
    """The viewer for ``store`` (opened read-only by the caller), shown as ``path``.

    A request refreshes the store's view first if the last refresh is older
    than ``refresh_seconds``.
    """
    viewer = Viewer(store, path, refresh_seconds)

    def api(fn: Callable[[Request], Any]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                return _json(fn(request))
            except _BadRequest as exc:
                return _json({"error": {"code": "bad_request", "message": str(exc)}}, 400)
            except Error as exc:
                status = 404 if isinstance(exc, LookupError) else 500
                return _json({"error": {"code": exc.code, "message": str(exc)}}, status)
            except OSError as exc:  # e.g. a segment the writer removed while we read it
                return _json({"error": {"code": "io", "message": f"{exc}; the page retries"}},
                             503)

        return endpoint

    def run_of(r: Request) -> str:
        return str(r.path_params["run"])

    routes = [
        Route("/api/store", api(lambda r: viewer.read(viewer.summary))),
        Route("/api/runs", api(lambda r: viewer.read(
            lambda s: viewer.runs(s, r.query_params.get("q", ""))))),
        Route("/api/runs/{run}/checkpoints", api(lambda r: viewer.read(
            lambda s: viewer.checkpoints(s, run_of(r), _int(r, "before"))))),
        Route("/api/runs/{run}/checkpoints/{id:int}", api(lambda r: viewer.read(
            lambda s: viewer.checkpoint(s, run_of(r), int(r.path_params["id"]))))),
        Route("/api/runs/{run}/diff", api(lambda r: viewer.read(
            lambda s: viewer.diff(s, run_of(r), _need(r, "a"), _need(r, "b"))))),
        Route("/api/runs/{run}/blob", lambda r: _blob(viewer, r)),
        Route("/api/effects", api(lambda r: viewer.read(lambda s: viewer.effects(
            s, r.query_params.get("run") or None, r.query_params.get("status") or None)))),
        Route("/api/outbox", api(lambda r: viewer.read(viewer.outbox))),
        Route("/api/health", api(lambda r: viewer.read(viewer.health))),
        Route("/api/verify", api(lambda r: viewer.read(viewer.verify))),
        Route("/", lambda r: FileResponse(os.path.join(STATIC, "index.html"),
                                          headers=_SECURITY_HEADERS)),
        Route("/favicon.ico", lambda r: Response(status_code=204)),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    return Starlette(routes=routes)


def _need(request: Request, name: str) -> int:
    value = _int(request, name)
    if value is None:
        raise _BadRequest(f"give {name}=ID")
    return value


def _blob(viewer: Viewer, request: Request) -> Response:
    """A blob's bytes as a download, with its media type."""
    run = str(request.path_params["run"])
    key = request.query_params.get("key", "")
    try:
        at = _int(request, "at")

        def open_it(s: Any) -> tuple[Any, BlobRef]:
            ref = s.get(run, key, at=at)
            return s.open_blob(run, key, at=at), ref

        reader, ref = viewer.read(open_it)
    except _BadRequest as exc:
        return _json({"error": {"code": "bad_request", "message": str(exc)}}, 400)
    except Error as exc:
        status = 404 if isinstance(exc, LookupError) else 400
        return _json({"error": {"code": exc.code, "message": str(exc)}}, status)

    def chunks() -> Iterator[bytes]:
        with reader:
            while block := reader.read(1 << 16):
                yield block

    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key) or "blob"
    headers = {**_SECURITY_HEADERS, "Content-Length": str(ref.size),
               "Content-Disposition": f'attachment; filename="{name}"'}
    return StreamingResponse(chunks(), media_type=ref.media_type or "application/octet-stream",
                             headers=headers)
