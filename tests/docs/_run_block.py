"""Runs one extracted doc block and records which line of it printed what.

Usage: python _run_block.py BLOCK.py RECORD.json. The block runs as __main__ in the current
directory with print() wrapped: each call is written through as usual and also recorded as
[line of the block that called print, the text printed], so the test can compare it with the
``# expected output`` comment on that line.
"""

from __future__ import annotations

import builtins
import io
import json
import sys

block_path, record_path = sys.argv[1], sys.argv[2]
with open(block_path, encoding="utf-8") as f:
    source = f.read()
records: list[tuple[int, str]] = []
real_print = builtins.print


def recording_print(*args: object, **kwargs: object) -> None:
    if kwargs.get("file") not in (None, sys.stdout):
        real_print(*args, **kwargs)  # type: ignore[call-overload]
        return
    text = io.StringIO()
    real_print(*args, **{**kwargs, "file": text})  # type: ignore[call-overload]
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != block_path:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is not None:
        records.append((frame.f_lineno, text.getvalue()))
    real_print(*args, **kwargs)  # type: ignore[call-overload]


builtins.print = recording_print
try:
    code = compile(source, block_path, "exec")
    exec(code, {"__name__": "__main__", "__file__": block_path})
finally:
    with open(record_path, "w", encoding="utf-8") as f:
        json.dump(records, f)
