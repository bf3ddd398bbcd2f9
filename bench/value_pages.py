#!/usr/bin/env python3
"""Disk per value by value size: does LMDB's cost follow the bytes around one overflow page?

Usage::

    .venv/bin/python bench/value_pages.py            # sizes 1,000 .. 10,000 bytes
    .venv/bin/python bench/value_pages.py --json
    PYTHONPATH=/tmp/old .venv/bin/python bench/value_pages.py   # another checkout's code

For each size, a fresh store commits ``--count`` distinct values of that many
random (incompressible) bytes, one per commit under its own key of one run,
then folds. The figure is the LMDB pages in use ((last page + 1) x page size,
after the fold) divided by the values, beside the value size: a ratio of 1.0
would be the bytes themselves. LMDB keeps a value larger than about 2,000
bytes on overflow pages of its own (4 KiB each here), so a layout that
stores values whole pays a whole page for a 2,000-byte value; issue #16
measured +75% disk against 1,900-byte values.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

from benchlib import scratch_dir

import agentwal

SIZES = (1000, 1900, 2000, 2100, 2500, 3000, 4000, 4100, 6000, 10000)


def per_value(size: int, count: int) -> float:
    rng = random.Random(size)
    with scratch_dir("value-pages-") as d, \
            agentwal.open(os.path.join(d, "v.awal"), durability="none") as store:
        for i in range(count):
            with store.begin("r") as txn:
                txn[f"v{i:05d}"] = rng.randbytes(size)
        store.snapshot()
        st = store.stats()
        return (st["lmdb_last_page"] + 1) * st["lmdb_page_size"] / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=400, help="values per size (default 400)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for size in SIZES:
        b = per_value(size, args.count)
        rows.append({"value_bytes": size, "disk_bytes_per_value": b, "ratio": b / size})
    if args.json:
        json.dump({"rows": rows, "count": args.count, "agentwal": agentwal.__file__,
                   "python": sys.version.split()[0]}, sys.stdout, indent=2)
        print()
        return
    print(f"{args.count} values per size, agentwal from {os.path.dirname(agentwal.__file__)}")
    print(f"{'value bytes':>12}{'disk bytes per value':>24}{'disk / value':>14}")
    for r in rows:
        print(f"{r['value_bytes']:>12,}{r['disk_bytes_per_value']:>24,.0f}{r['ratio']:>14.2f}")


if __name__ == "__main__":
    main()
