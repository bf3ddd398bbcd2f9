"""What LOGMARK's acknowledged-LSN slot write costs a synchronous commit (issue #10, case 3).

Usage: ``.venv/bin/python bench/bench_logmark.py [--rounds 9] [--commits 400]``

After every sync of the log the writer overwrites one 16-byte slot of
``LOGMARK`` in place, unsynced (open, pwrite, close). This runs 9
(``--rounds``) interleaved rounds of 400 (``--commits``) one-key ``sync``
commits with that write and with it replaced by nothing, each in a fresh
store under the working directory (removed after), and prints the medians
and ranges of commits per second.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import agentwal
from agentwal.local.wal.writer import Writer

real = Writer._note_acked


def run(with_mark: bool, n: int = 400) -> float:
    Writer._note_acked = real if with_mark else (lambda self, lsn: None)  # type: ignore
    d = tempfile.mkdtemp(dir=os.getcwd())
    try:
        with agentwal.open(os.path.join(d, "s")) as s:
            t = time.perf_counter()
            for i in range(n):
                with s.begin("r") as txn:
                    txn["i"] = i
            return n / (time.perf_counter() - t)
    finally:
        shutil.rmtree(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--commits", type=int, default=400)
    args = ap.parse_args()
    a: list[float] = []
    b: list[float] = []
    for k in range(args.rounds):  # alternate which goes first
        if k % 2:
            a.append(run(True, args.commits))
            b.append(run(False, args.commits))
        else:
            b.append(run(False, args.commits))
            a.append(run(True, args.commits))
    print(f"sync commits/s, {args.rounds} interleaved rounds of {args.commits} (median, "
          "min-max): with the slot "
          f"write {statistics.median(a):.0f} ({min(a):.0f}-{max(a):.0f}), without "
          f"{statistics.median(b):.0f} ({min(b):.0f}-{max(b):.0f})")


if __name__ == "__main__":
    main()
