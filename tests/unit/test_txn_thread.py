"""Issue #10, case 7: a transaction is one thread's, and another thread is refused.

Every method of a transaction used from a thread other than the one that
began it raises ``TransactionThreadError`` and does nothing; the owner can
go on. asyncio code keeps working: ``acommit``, ``aput_blob`` and
``aput_tree`` lend the transaction to their executor thread while the task
awaits them.
"""

from __future__ import annotations

import asyncio
import io
import threading
from pathlib import Path
from typing import Any

import pytest

import agentwal
from agentwal.errors import TransactionThreadError


def _in_other_thread(fn: Any) -> BaseException | None:
    out: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the test
            out[0] = exc

    t = threading.Thread(target=run, name="intruder")
    t.start()
    t.join(30)
    return out[0]


@pytest.mark.parametrize("use", [
    lambda txn: txn.get("k"),
    lambda txn: txn.put("k", 2),
    lambda txn: txn.delete("k"),
    lambda txn: txn.meta(node="x"),
    lambda txn: txn.commit(),
    lambda txn: txn.rollback(),
    lambda txn: txn.put_blob("b", io.BytesIO(b"data")),
], ids=["get", "put", "delete", "meta", "commit", "rollback", "put_blob"])
def test_another_thread_is_refused(tmp_path: Path, use: Any) -> None:
    with agentwal.open(tmp_path / "s") as store:
        txn = store.begin("r")
        txn["k"] = 1
        exc = _in_other_thread(lambda: use(txn))
        assert isinstance(exc, TransactionThreadError), exc
        assert exc.code == "transaction_thread" and "'intruder'" in str(exc)
        assert txn.state == "active" and txn["k"] == 1  # nothing was done
        txn.commit()
        assert store.state("r") == {"k": 1}


def test_asyncio_calls_lend_the_transaction_to_their_executor(tmp_path: Path) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    (src / "a.txt").write_text("hello")

    async def main(store: agentwal.Store) -> None:
        async with store.abegin("r") as txn:
            txn["k"] = 1
            await txn.aput_blob("blob", io.BytesIO(b"artifact"))
            await txn.aput_tree("tree", src)
            txn["after"] = True  # the task's own thread again
        with pytest.raises(TransactionThreadError):
            txn2 = await store.abegin("r")
            try:
                await asyncio.to_thread(txn2.put, "k", 2)
            finally:
                txn2.rollback()

    with agentwal.open(tmp_path / "s") as store:
        asyncio.run(main(store))
        assert store.get("r", "k") == 1 and store.get("r", "after") is True
        with store.open_blob("r", "blob") as f:
            assert f.read() == b"artifact"
