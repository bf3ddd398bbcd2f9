"""HEALTH: the writer's last word on its background work, for readers in other processes.

Theory of operation: a fold or retention pass that fails leaves nothing in
LMDB (its transaction aborts) and its error lived only in the writer's
memory, so ``agentwal inspect`` or the viewer, opened read-only beside the
writer or after it died, could not say "the last fold failed". The writer
therefore keeps ``<store>/HEALTH``, a small JSON document:

``{"format": 1, "store_id": "<uuid>", "written_at": <unix seconds>,
"settings": {"wal_max_bytes": N, "durability": "sync"},
"fold": null or {"at": <unix seconds>, "error": "<text>", "code": "<error code>"},
"retention": the same}``

It is written when a writer opens with settings other than the ones the file
holds (or there is no file), when a failure begins or its text changes, and
when the next success ends it (the entry becomes null). Not on every fold:
a healthy writer rewrites nothing.

Why a file of its own and not CONTROL: CONTROL is the store's identity,
written once at creation; rewriting it at run time would put the one file
every open needs at risk for advisory facts. Why JSON, not CBOR: a person
on call can ``cat`` it. Why not through the I/O seam and not synced (like
``LOCK`` and ``cache/``): it is advice, not state. Losing it in a power cut
loses nothing acknowledged, a write of it must never fail or slow a fold or
a commit (a full disk is one reason folds fail), and keeping it out of the
seam leaves the simulated disk's operation sequence the crash tests
enumerate as it was. It is still replaced atomically (``HEALTH.tmp``, then
``os.replace``), so a reader sees the old or the new document.

Reading (:func:`read_health`) never raises: a store without the file (made
before it existed, or never opened by a writer since) reads as None, "none
recorded"; a damaged file, another store's file, or one of another format
reads as ``{"unreadable": "<why>"}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

from ..io import OsFileSystem, replace_file

__all__ = ["HEALTH_FILE", "HEALTH_FORMAT", "HealthFile", "read_health"]

#: The file's name in the store directory.
HEALTH_FILE = "HEALTH"
#: The version of the document.
HEALTH_FORMAT = 1
#: The background jobs whose failures the file records.
JOBS = ("fold", "retention")
_MAX_ERROR = 2000  # characters of an error's text kept


class HealthFile:
    """The writer's ``HEALTH`` document: what it holds now, and writing it when it changes."""

    def __init__(self, directory: str, store_id: object) -> None:
        self.path = os.path.join(directory, HEALTH_FILE)
        self._store_id = str(store_id)
        self._lock = threading.Lock()
        found = read_health(directory, store_id)
        usable = found is not None and "unreadable" not in found
        self._doc: dict[str, Any] = {
            "settings": dict(found.get("settings") or {}) if usable and found else {},
            **{job: (found.get(job) if usable and found else None) for job in JOBS}}
        self._written = usable

    def opened(self, settings: dict[str, Any]) -> None:
        """A writer opened with ``settings``: write them if the file says otherwise."""
        with self._lock:
            if self._written and self._doc["settings"] == settings:
                return
            self._doc["settings"] = dict(settings)
            self._write()

    def failed(self, job: str, exc: BaseException) -> None:
        """``job`` failed with ``exc``: record it (once per distinct error text)."""
        text = str(exc)[:_MAX_ERROR]
        with self._lock:
            now = self._doc[job]
            if now is not None and now.get("error") == text:
                return
            self._doc[job] = {"at": round(time.time(), 3), "error": text,
                              "code": getattr(exc, "code", None) or type(exc).__name__}
            self._write()

    def succeeded(self, job: str) -> None:
        """``job`` succeeded: clear a failure it recorded (nothing is written otherwise)."""
        if self._doc[job] is None:  # the common case, without the lock
            return
        with self._lock:
            if self._doc[job] is not None:
                self._doc[job] = None
                self._write()

    def _write(self) -> None:
        """Replace the file atomically, unsynced; a failure is ignored (it is only advice)."""
        doc = {"format": HEALTH_FORMAT, "store_id": self._store_id,
               "written_at": round(time.time(), 3), **self._doc}
        with contextlib.suppress(OSError):
            replace_file(OsFileSystem(), os.path.dirname(self.path), HEALTH_FILE,
                         (json.dumps(doc, indent=1) + "\n").encode(), sync=False)
            self._written = True


def read_health(directory: str, store_id: object = None) -> dict[str, Any] | None:
    """The store's HEALTH document; None when it has none; ``{"unreadable": why}`` if damaged.

    With ``store_id``, a document of another store is unreadable too.
    """
    path = os.path.join(directory, HEALTH_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"unreadable": f"cannot be read: {exc.strerror or exc}"}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {"unreadable": "not a JSON document (damaged)"}
    if not isinstance(doc, dict) or doc.get("format") != HEALTH_FORMAT:
        return {"unreadable": f"format {doc.get('format') if isinstance(doc, dict) else '?'}, "
                              f"this agentwal reads format {HEALTH_FORMAT}"}
    if store_id is not None and doc.get("store_id") != str(store_id):
        return {"unreadable": "it belongs to another store (copied from one?)"}
    for job in JOBS:
        entry = doc.get(job)
        if entry is not None and not (isinstance(entry, dict) and isinstance(
                entry.get("error"), str) and isinstance(entry.get("at"), (int, float))):
            return {"unreadable": f"its {job!r} entry is malformed"}
    if not isinstance(doc.get("settings", {}), dict):
        return {"unreadable": "its settings are malformed"}
    return doc
