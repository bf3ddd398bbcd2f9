"""The judge of a salvage from a damaged copy: never wrong data, nothing lost silently.

The salvaged store is compared with the undamaged store the copy was made
from, checkpoint by checkpoint under the same ids: every value it holds must
equal the original's at that checkpoint (same type), every checkpoint's
metadata and fork origin too; and everything the original holds that the
salvaged store lacks (a run, a checkpoint, a value at a checkpoint) must be
named in the salvage report.
"""

from __future__ import annotations

from typing import Any

import agentwal
from agentwal.local.salvage import SalvageReport


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def judge_salvage(original: str, salvaged: str, report: SalvageReport) -> list[str]:
    """What is wrong with ``salvaged`` against ``original`` (empty: nothing)."""
    bad: list[str] = []
    unnamed = any(r.startswith("#") for r in report.lost_runs) or any(
        "database runs" in p or "main tree" in p or "missing" in p or "empty" in p
        or "meta page" in p for p in report.snapshot)
    # LMDB keeps the previous fold's tree whole: read instead of a lost newest one, it
    # holds every run as of that fold, and the report says the later part is lost.
    older = any("older fold's tree" in p for p in report.snapshot)
    with agentwal.open(original, readonly=True) as want, \
            agentwal.open(salvaged, readonly=True) as got:
        want_runs, got_runs = set(want.runs()), set(got.runs())
        for run in sorted(got_runs - want_runs):
            bad.append(f"run {run!r} should not exist")
        for run in sorted(want_runs - got_runs):
            logged = report.lost is not None and run in report.lost.checkpoints
            if run not in report.lost_runs and not unnamed and not logged:
                bad.append(f"run {run!r} is missing and the report does not say so")
        for run in sorted(want_runs & got_runs):
            wh = {c.id: c for c in want.history(run)}
            gh = {c.id: c for c in got.history(run)}
            lost_ids = set(report.lost_checkpoints.get(run, []))
            if report.lost is not None:  # the log past its damage, or not joined
                lost_ids.update(report.lost.checkpoints.get(run, []))
            for cid in sorted(gh.keys() - wh.keys()):
                bad.append(f"{run}/{cid} should not exist")
            top = max(gh, default=0)
            for cid in sorted(wh.keys() - gh.keys()):
                if cid not in lost_ids and not (older and cid > top):
                    bad.append(f"{run}/{cid} is missing and the report does not say so")
            for cid in sorted(gh.keys() & wh.keys()):
                w, g = wh[cid], gh[cid]
                if w.meta != g.meta:
                    bad.append(f"{run}/{cid} metadata {g.meta} != {w.meta}")
                if w.origin != g.origin:
                    bad.append(f"{run}/{cid} origin {g.origin} != {w.origin}")
                ws, gs = want.state(run, at=cid), got.state(run, at=cid)
                for key in sorted(gs):
                    if key not in ws:
                        bad.append(f"{run}/{cid}/{key} should not exist")
                    elif not _same(gs[key], ws[key]):
                        bad.append(f"{run}/{cid}/{key} holds another value")
                for key in sorted(ws.keys() - gs.keys()):
                    if cid not in report.lost_values.get(run, {}).get(key, []):
                        bad.append(f"{run}/{cid}/{key} is missing and the report does not "
                                   "say so")
    return bad
