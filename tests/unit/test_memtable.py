"""The memtable: version chains read at snapshots, deletions, pruning, freezing, fold views."""

from __future__ import annotations

import pytest

from agentwal.local.memtable import Memtable, RunMem
from agentwal.types import Checkpoint


def ckpt(run: str, cid: int, lsn: int) -> Checkpoint:
    return Checkpoint(run, cid, cid - 1 or None, lsn, 1000.0 + lsn, {"lsn": lsn}, f"{lsn:064x}")


class Log:
    """Applies commits to a memtable with consecutive LSNs and per-run checkpoint ids."""

    def __init__(self, mem: Memtable | None = None) -> None:
        self.mem = mem or Memtable()
        self.lsn = 0
        self.ids: dict[str, int] = {}

    def commit(self, run: str, delta: dict[str, bytes | None],
               oldest: int | None = None) -> Checkpoint:
        """``oldest`` defaults to what the store passes with no view open: the visible LSN."""
        self.lsn += 1
        cid = self.ids[run] = self.ids.get(run, 0) + 1
        c = ckpt(run, cid, self.lsn)
        self.mem.apply(self.lsn, c, bytes([self.lsn % 256]) * 32, b"\xa0", delta,
                       self.lsn - 1 if oldest is None else oldest)
        return c


def test_an_empty_memtable() -> None:
    m = Memtable()
    assert len(m) == 0
    assert (m.last_lsn, m.nbytes) == (0, 0)
    assert not m.frozen
    assert m.lookup("r", "k", 1 << 62) == (False, None)
    assert m.visible("r", 1 << 62) == {}
    assert m.fold_view() == {}


# -- lookup at snapshots --------------------------------------------------------------------


def test_lookup_gives_the_newest_version_at_or_below_the_snapshot() -> None:
    log = Log()
    log.commit("r", {"k": b"v1"}, oldest=0)  # lsn 1
    log.commit("r", {"other": b"o"}, oldest=0)  # lsn 2
    log.commit("r", {"k": b"v3"}, oldest=0)  # lsn 3
    log.commit("r", {"k": b"v4"}, oldest=0)  # lsn 4
    m = log.mem
    assert m.lookup("r", "k", 0) == (False, None)  # before the first version
    assert m.lookup("r", "k", 1) == (True, b"v1")
    assert m.lookup("r", "k", 2) == (True, b"v1")
    assert m.lookup("r", "k", 3) == (True, b"v3")
    assert m.lookup("r", "k", 4) == (True, b"v4")
    assert m.lookup("r", "k", 1 << 62) == (True, b"v4")


def test_lookup_of_unknown_run_or_key() -> None:
    log = Log()
    log.commit("r", {"k": b"v"})
    assert log.mem.lookup("r", "nope", 10) == (False, None)
    assert log.mem.lookup("s", "k", 10) == (False, None)


def test_a_deletion_is_found_as_none() -> None:
    log = Log()
    log.commit("r", {"k": b"v"}, oldest=0)
    log.commit("r", {"k": None}, oldest=0)
    log.commit("r", {"k": b"again"}, oldest=0)
    m = log.mem
    assert m.lookup("r", "k", 1) == (True, b"v")
    assert m.lookup("r", "k", 2) == (True, None)  # found: deleted, do not look below
    assert m.lookup("r", "k", 3) == (True, b"again")


def test_deleting_a_key_the_memtable_never_saw() -> None:
    log = Log()
    log.commit("r", {"k": None})
    assert log.mem.lookup("r", "k", 1) == (True, None)  # shadows LMDB's value
    assert log.mem.visible("r", 1) == {"k": None}


def test_runs_are_separate() -> None:
    log = Log()
    log.commit("a", {"k": b"a"})
    log.commit("b", {"k": b"b"})
    assert log.mem.lookup("a", "k", 2) == (True, b"a")
    assert log.mem.lookup("b", "k", 2) == (True, b"b")
    assert log.mem.lookup("b", "k", 1) == (False, None)


def test_empty_string_value_is_not_a_deletion() -> None:
    log = Log()
    log.commit("r", {"k": b""})
    assert log.mem.lookup("r", "k", 1) == (True, b"")


# -- visible --------------------------------------------------------------------------------


def test_visible_gives_every_key_the_table_decides_at_the_snapshot() -> None:
    log = Log()
    log.commit("r", {"a": b"1", "b": b"1"}, oldest=0)  # 1
    log.commit("r", {"b": None, "c": b"2"}, oldest=0)  # 2
    log.commit("r", {"a": b"3", "d": b"3"}, oldest=0)  # 3
    log.commit("s", {"x": b"4"}, oldest=0)  # 4
    m = log.mem
    assert m.visible("r", 0) == {}
    assert m.visible("r", 1) == {"a": b"1", "b": b"1"}
    assert m.visible("r", 2) == {"a": b"1", "b": None, "c": b"2"}
    assert m.visible("r", 3) == {"a": b"3", "b": None, "c": b"2", "d": b"3"}
    assert m.visible("r", 99) == m.visible("r", 3)
    assert m.visible("s", 3) == {}
    assert m.visible("s", 4) == {"x": b"4"}
    assert m.visible("nope", 99) == {}


def test_visible_returns_a_new_dict() -> None:
    log = Log()
    log.commit("r", {"a": b"1"})
    v = log.mem.visible("r", 1)
    v["a"] = b"changed"
    assert log.mem.lookup("r", "a", 1) == (True, b"1")


# -- pruning --------------------------------------------------------------------------------


def chain(m: Memtable, run: str, key: str) -> list[int]:
    return [lsn for lsn, _v in m.runs[run].versions[key]]


def test_without_readers_a_chain_stays_short() -> None:
    log = Log()
    for i in range(50):
        log.commit("r", {"k": b"%d" % i})  # oldest = the LSN visible before this commit
    assert chain(log.mem, "r", "k") == [49, 50]
    assert log.mem.lookup("r", "k", 49) == (True, b"48")
    assert log.mem.lookup("r", "k", 50) == (True, b"49")


def test_pruning_keeps_what_the_oldest_snapshot_needs() -> None:
    log = Log()
    for i in range(1, 11):
        log.commit("r", {"k": b"v%d" % i}, oldest=4)  # a reader at LSN 4 is open
    m = log.mem
    assert chain(m, "r", "k") == list(range(4, 11))
    for snap in range(4, 11):
        assert m.lookup("r", "k", snap) == (True, b"v%d" % snap)


def test_pruning_keeps_the_version_a_snapshot_between_versions_reads() -> None:
    log = Log()
    log.commit("r", {"k": b"v1"}, oldest=0)  # 1
    for _ in range(5):
        log.commit("r", {"other": b"x"}, oldest=0)  # 2..6
    log.commit("r", {"k": b"v7"}, oldest=4)  # 7: the reader at 4 still sees v1
    log.commit("r", {"k": b"v8"}, oldest=4)  # 8
    assert chain(log.mem, "r", "k") == [1, 7, 8]
    assert log.mem.lookup("r", "k", 4) == (True, b"v1")


def test_pruning_keeps_a_deletion_a_snapshot_still_sees() -> None:
    log = Log()
    log.commit("r", {"k": b"v1"}, oldest=0)  # 1
    log.commit("r", {"k": None}, oldest=0)  # 2
    log.commit("r", {"k": b"v3"}, oldest=2)  # 3
    assert chain(log.mem, "r", "k") == [2, 3]
    assert log.mem.lookup("r", "k", 2) == (True, None)


def test_a_snapshot_older_than_every_version_prunes_nothing() -> None:
    log = Log()
    for i in range(1, 6):
        log.commit("r", {"k": b"v%d" % i}, oldest=0)
    assert chain(log.mem, "r", "k") == [1, 2, 3, 4, 5]


def test_pruning_only_touches_the_key_written() -> None:
    log = Log()
    log.commit("r", {"a": b"1", "b": b"1"}, oldest=0)  # 1
    log.commit("r", {"a": b"2", "b": b"2"}, oldest=0)  # 2
    log.commit("r", {"a": b"3"}, oldest=2)  # 3: only a's chain is pruned
    assert chain(log.mem, "r", "a") == [2, 3]
    assert chain(log.mem, "r", "b") == [1, 2]


# -- freezing -------------------------------------------------------------------------------


def test_a_frozen_memtable_refuses_apply() -> None:
    log = Log()
    log.commit("r", {"k": b"v"})
    log.mem.frozen = True
    before = (len(log.mem), log.mem.last_lsn, log.mem.nbytes)
    with pytest.raises(AssertionError, match="frozen"):
        log.commit("r", {"k": b"w"})
    assert (len(log.mem), log.mem.last_lsn, log.mem.nbytes) == before
    assert log.mem.lookup("r", "k", 99) == (True, b"v")  # still readable


# -- fold view ------------------------------------------------------------------------------


def test_fold_view_gives_final_writes_and_checkpoints_in_order() -> None:
    log = Log()
    c1 = log.commit("a", {"x": b"1", "y": b"1"})
    c2 = log.commit("b", {"z": b"2"})
    c3 = log.commit("a", {"x": b"3", "y": None})
    c4 = log.commit("a", {}, oldest=0)  # a commit with metadata only
    view = log.mem.fold_view()
    assert set(view) == {"a", "b"}
    writes, entries = view["a"]
    assert writes == {"x": b"3", "y": None}  # the deletion must reach LMDB
    assert [e[0] for e in entries] == [c1, c3, c4]
    assert entries[0][1] == bytes([1]) * 32 and entries[0][2] == b"\xa0"
    writes_b, entries_b = view["b"]
    assert writes_b == {"z": b"2"} and [e[0] for e in entries_b] == [c2]


def test_fold_view_after_pruning_still_has_the_final_write() -> None:
    log = Log()
    for i in range(20):
        log.commit("r", {"k": b"%d" % i})
    writes, entries = log.mem.fold_view()["r"]
    assert writes == {"k": b"19"}
    assert [c.id for c, _h, _m in entries] == list(range(1, 21))


# -- heads, sizes and LSNs ------------------------------------------------------------------


def test_head_is_the_newest_checkpoint_at_or_below_the_snapshot() -> None:
    log = Log()
    log.commit("other", {"k": b"x"})  # lsn 1
    c2 = log.commit("r", {"k": b"1"})  # lsn 2
    log.commit("other", {"k": b"y"})  # lsn 3
    c4 = log.commit("r", {"k": b"2"})  # lsn 4
    rm = log.mem.runs["r"]
    assert rm.head(1) is None
    assert rm.head(2) == c2
    assert rm.head(3) == c2
    assert rm.head(4) == c4
    assert rm.head(1 << 62) == c4


def test_head_of_an_empty_run() -> None:
    assert RunMem().head(10) is None


def test_first_and_last_lsn() -> None:
    log = Log()
    log.lsn = 41  # a memtable after a fold starts mid-log
    log.commit("r", {"k": b"1"})
    assert log.mem.last_lsn == 42
    log.commit("s", {"k": b"2"})
    log.commit("r", {})
    assert log.mem.last_lsn == 44


def test_len_counts_commits_not_keys() -> None:
    log = Log()
    log.commit("a", {"x": b"1", "y": b"2", "z": b"3"})
    log.commit("b", {})
    log.commit("a", {"x": None})
    assert len(log.mem) == 3


def test_nbytes_counts_keys_values_and_overhead() -> None:
    log = Log()
    log.commit("r", {"key": b"12345"})
    assert log.mem.nbytes == 3 + 5 + 16
    log.commit("r", {"key": None})  # a deletion costs its key and the overhead
    assert log.mem.nbytes == (3 + 5 + 16) + (3 + 16)
    log.commit("r", {})  # a metadata-only commit writes no key
    assert log.mem.nbytes == (3 + 5 + 16) + (3 + 16)


def test_nbytes_keeps_growing_when_versions_are_pruned() -> None:
    """nbytes measures what was applied (the fold trigger), not what the chains hold now."""
    log = Log()
    for _ in range(10):
        log.commit("r", {"k": b"v"})
    assert log.mem.nbytes == 10 * (1 + 1 + 16)


# -- run deletions (tombstones) ---------------------------------------------------------------


def _delete(log: Log, run: str) -> int:
    log.lsn += 1
    log.mem.apply_delete(log.lsn, run)
    log.ids[run] = 0
    return log.lsn


def test_a_deletion_hides_the_run_from_later_snapshots_only() -> None:
    log = Log()
    c1 = log.commit("r", {"k": b"1", "j": b"1"}, oldest=0)  # lsn 1
    log.commit("s", {"k": b"s"}, oldest=0)  # lsn 2
    t = _delete(log, "r")  # lsn 3
    m = log.mem
    assert (m.last_lsn, m.masks("r", 2), m.masks("r", t), m.masks("s", t)) == (3, False,
                                                                                True, False)
    assert m.lookup("r", "k", 2) == (True, b"1")  # an older snapshot still reads it
    assert m.lookup("r", "k", t) == (True, None)  # deleted
    assert m.lookup("r", "never", t) == (True, None)  # decided here: nothing below
    assert m.lookup("r", "never", 2) == (False, None)
    assert m.visible("r", 2) == {"k": b"1", "j": b"1"} and m.visible("r", t) == {}
    rm = m.runs["r"]
    assert rm.head(2) == c1 and rm.head(t) is None and rm.latest(1 << 62) is None
    assert (rm.floor(2), rm.floor(t), rm.floor(1 << 62)) == (0, t, t)


def test_a_run_recreated_after_its_deletion() -> None:
    log = Log()
    log.commit("r", {"k": b"old", "gone": b"x"}, oldest=0)  # lsn 1
    log.commit("r", {"k": b"old2"}, oldest=0)  # lsn 2
    t = _delete(log, "r")  # lsn 3
    n1 = log.commit("r", {"k": b"new"}, oldest=0)  # lsn 4, id 1 again
    m = log.mem
    assert n1.id == 1
    assert m.lookup("r", "k", 2) == (True, b"old2")
    assert m.lookup("r", "k", t) == (True, None)
    assert m.lookup("r", "k", 4) == (True, b"new")
    assert m.lookup("r", "gone", 4) == (True, None)
    assert m.visible("r", 4) == {"k": b"new"}
    assert m.runs["r"].head(4) == n1 and m.runs["r"].head(2).id == 2  # type: ignore[union-attr]
    (run, reset, writes, ckpts, deltas, outboxes), = m.fold_runs()
    assert (run, reset, writes) == ("r", t, {"k": b"new"})  # reset: the deletion's LSN
    assert [c for c, _h, _m in ckpts] == [n1] and deltas == [{"k": b"new"}] and outboxes == {}
    assert m.fold_view() == {"r": ({"k": b"new"}, ckpts)}


def test_fold_runs_of_a_deleted_run_with_nothing_after() -> None:
    log = Log()
    log.commit("r", {"k": b"1"})
    _delete(log, "r")
    log.commit("s", {"k": b"2"})
    got = {r[0]: r for r in log.mem.fold_runs()}
    assert got["r"][1:] == (2, {}, [], [], {})  # deleted at LSN 2
    assert got["s"][1] == 0 and got["s"][2] == {"k": b"2"}
    assert not log.mem.empty


def test_two_deletions_in_one_table() -> None:
    log = Log()
    log.commit("r", {"a": b"1"}, oldest=0)  # lsn 1
    t1 = _delete(log, "r")  # lsn 2
    log.commit("r", {"b": b"2"}, oldest=0)  # lsn 3
    t2 = _delete(log, "r")  # lsn 4
    c = log.commit("r", {"c": b"3"}, oldest=0)  # lsn 5
    m = log.mem
    assert [m.visible("r", s) for s in (1, t1, 3, t2, 5)] == [
        {"a": b"1"}, {}, {"b": b"2"}, {}, {"c": b"3"}]
    assert m.runs["r"].deleted == [t1, t2]
    (_run, reset, writes, ckpts, _d, _o), = m.fold_runs()
    assert reset and writes == {"c": b"3"} and [e[0] for e in ckpts] == [c]


def test_a_frozen_table_takes_no_deletion() -> None:
    m = Memtable()
    m.frozen = True
    with pytest.raises(AssertionError, match="frozen"):
        m.apply_delete(1, "r")
    assert RunMem().floor(5) == 0
