"""A fake downstream service that counts calls and applications per key.

It keeps its journal in a file (one JSON line per event, flushed and fsynced
before it answers), so it outlives a child process killed mid-effect and the
test can count what really reached "the world".

Switches:
    dedup: apply each idempotency key at most once (an ``Idempotency-Key``
        honouring API); otherwise every call applies.
    lose_response: apply, then raise ``TimeoutError`` (the answer is lost).
    fail_before_apply: raise ``ConnectionError`` without applying.
    probe_says: what ``probe`` answers: ``"truth"`` (looks at the journal),
        ``"applied"``, ``"not_applied"`` or ``"unknown"``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import agentwal


class Downstream:
    """One fake service; every instance on the same ``journal`` sees the same world."""

    def __init__(self, journal: str, *, dedup: bool = False, lose_response: bool = False,
                 fail_before_apply: bool = False, probe_says: str = "truth") -> None:
        self.journal = journal
        self.dedup = dedup
        self.lose_response = lose_response
        self.fail_before_apply = fail_before_apply
        self.probe_says = probe_says

    # -- the journal --------------------------------------------------------------

    def _log(self, kind: str, key: str, **extra: Any) -> None:
        line = json.dumps({"kind": kind, "key": key, **extra}) + "\n"
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def events(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.journal):
            return []
        with open(self.journal) as f:
            return [json.loads(line) for line in f if line.strip()]

    def calls(self, key: str | None = None) -> int:
        return sum(1 for e in self.events() if e["kind"] == "call"
                   and (key is None or e["key"] == key))

    def applications(self, key: str | None = None) -> int:
        return sum(1 for e in self.events() if e["kind"] == "apply"
                   and (key is None or e["key"] == key))

    def per_key(self, kind: str) -> Counter[str]:
        return Counter(e["key"] for e in self.events() if e["kind"] == kind)

    def applied(self, key: str) -> bool:
        return self.applications(key) > 0

    # -- the service --------------------------------------------------------------

    def call(self, ctx: agentwal.EffectContext) -> dict[str, Any]:
        """The effect function: ``fn(ctx)``."""
        self._log("call", ctx.key, attempt=ctx.attempt)
        if self.fail_before_apply:
            raise ConnectionError("downstream unreachable")
        if not (self.dedup and self.applied(ctx.key)):
            self._log("apply", ctx.key, attempt=ctx.attempt)
        if self.lose_response:
            raise TimeoutError("the response was lost")
        return {"key": ctx.key, "args": ctx.args}

    def probe(self, ctx: agentwal.EffectContext) -> Any:
        """``probe(ctx)``: was ``ctx.key`` applied?"""
        self._log("probe", ctx.key)
        says = self.probe_says
        if says == "unknown":
            return agentwal.UNKNOWN
        if says == "not_applied" or (says == "truth" and not self.applied(ctx.key)):
            return agentwal.NOT_APPLIED
        return {"key": ctx.key, "args": ctx.args}
