"""Issue #10, case 6: verify does not cry wolf on a folded store.

Once the state holding blobs, trees and every kind of value the codec
accepts is folded into LMDB (``snapshot()``, a reopen, a compaction), and
read back by a read-only store in the same way, ``verify`` reports nothing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import uuid
from pathlib import Path

import agentwal

EVERY_KIND = {
    "none": None, "true": True, "false": False, "int": 7, "big": 2**200, "neg": -(2**70),
    "float": 3.25, "str": "héllo", "empty": "", "bytes": b"\x00\xffraw",
    "bytearray": bytearray(b"ba"),
    "list": [1, "two", [3.0]], "tuple": (1, 2), "dict": {"a": {"b": [None]}}, "set": {1, 2},
    "frozenset": frozenset({"x"}), "decimal": decimal.Decimal("12.50"),
    "uuid": uuid.UUID(int=42), "datetime": dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc),
    "tz": dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    "tuple_keys": {(1, 2): "pair"},
}


def test_verify_is_clean_on_a_folded_store_with_blobs_trees_and_every_value(
        tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("alpha")
    (tree / "sub" / "b.bin").write_bytes(bytes(range(256)))
    path = tmp_path / "s"
    with agentwal.open(path) as store:
        for i in range(3):
            with store.begin("r") as txn:
                for k, v in EVERY_KIND.items():
                    txn[k] = v
                txn["i"] = i
                txn.put_blob("blob", io.BytesIO(b"artifact %d" % i), media_type="text/plain")
                txn.put_tree("tree", tree)
            (tree / "a.txt").write_text(f"alpha {i}")
        assert store.verify().ok  # unfolded
        store.snapshot()
        report = store.verify()
        assert report.ok, report.problems
    with agentwal.open(path) as store:  # folded at close, reopened
        assert store.verify().ok, store.verify().problems
        store.compact(keep_last=2)
        assert store.verify().ok, store.verify().problems
        assert store.get("r", "decimal") == decimal.Decimal("12.50")
    with agentwal.open(path, readonly=True) as ro:
        report = ro.verify()
        assert report.ok, report.problems
        assert report.checked.get("blob_bytes", 0) > 0
