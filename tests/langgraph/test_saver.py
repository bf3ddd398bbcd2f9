"""AgentWALSaver beyond the conformance suite: versions, write order, rich values, sharing,
concurrency, copies, serializers, reopen, the CLI's view of a thread, the async family."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import subprocess
import sys
import threading
import uuid
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

import agentwal
from agentwal.cli import main as cli
from agentwal.integrations.langgraph import AgentWALSaver
from agentwal.integrations.langgraph import _layout as L
from agentwal.integrations.langgraph import _saver as saver_module


class Order(BaseModel):
    sku: str
    qty: int
    placed: datetime.datetime


def cfg(thread: str, ns: str = "", cid: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def checkpoint(values: dict[str, Any], versions: dict[str, Any]) -> Checkpoint:
    return {"v": 4, "id": str(uuid6(clock_seq=1)),
            "ts": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "channel_values": values, "channel_versions": versions, "versions_seen": {},
            "updated_channels": list(values)}


class Chat:
    """Drives a saver like the Pregel loop does for a one-node chat graph."""

    def __init__(self, saver: AgentWALSaver, thread: str, ns: str = "") -> None:
        self.saver, self.thread, self.ns = saver, thread, ns
        self.config: dict[str, Any] = cfg(thread, ns)
        self.messages: list[Any] = []
        self.version: str | None = None

    def step(self, message: Any, *, step: int = 0, **meta: Any) -> dict[str, Any]:
        if self.config["configurable"].get("checkpoint_id"):
            self.saver.put_writes(self.config, [("messages", [message])], str(uuid.uuid4()))
        self.messages = [*self.messages, message]
        self.version = self.saver.get_next_version(self.version, None)
        cp = checkpoint({"messages": self.messages}, {"messages": self.version})
        self.config = self.saver.put(self.config, cp, {"source": "loop", "step": step, **meta},
                                     {"messages": self.version})
        return self.config


def big(i: int) -> AIMessage:
    return AIMessage(content=f"message {i} " + "x" * 1000, id=f"m{i}")


# -- versions ---------------------------------------------------------------------------


def test_next_version_increases_from_none_int_and_str(saver: AgentWALSaver) -> None:
    v1 = saver.get_next_version(None, None)
    v2 = saver.get_next_version(v1, None)
    assert v1 < v2 and int(v2.split(".")[0]) == 2
    assert int(saver.get_next_version(7, None).split(".")[0]) == 8  # an int from another saver
    versions = [v1]
    for _ in range(50):
        versions.append(saver.get_next_version(versions[-1], None))
    assert versions == sorted(versions) and len(set(versions)) == len(versions)


def test_two_branches_of_one_thread_never_share_a_version_slot(saver: AgentWALSaver) -> None:
    base = saver.get_next_version(None, None)
    a, b = saver.get_next_version(base, None), saver.get_next_version(base, None)
    assert a != b and L.value_key("root", "c", a) != L.value_key("root", "c", b)


# -- writes -----------------------------------------------------------------------------


def test_writes_come_back_in_writes_sort_key_order(saver: AgentWALSaver) -> None:
    stored = saver.put(cfg("t"), checkpoint({}, {}), {"step": 0}, {})
    saver.put_writes(stored, [("b", 1), ("a", 2)], "task-z", "~p, 2")
    saver.put_writes(stored, [("c", 3)], "task-a", "~p, 1")
    saver.put_writes(stored, [("d", 4)], "task-m", "")
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert tup.pending_writes == [("task-m", "d", 4), ("task-a", "c", 3),
                                  ("task-z", "b", 1), ("task-z", "a", 2)]


def test_special_writes_overwrite_and_regular_writes_keep_the_first(
        saver: AgentWALSaver) -> None:
    stored = saver.put(cfg("t"), checkpoint({}, {}), {"step": 0}, {})
    saver.put_writes(stored, [("x", "first"), ("__error__", "e1")], "task")
    saver.put_writes(stored, [("x", "second"), ("__error__", "e2")], "task")
    saver.put_writes(stored, [("__interrupt__", ["i1"])], "task")
    saver.put_writes(stored, [("__interrupt__", ["i2"])], "task")
    tup = saver.get_tuple(stored)
    assert tup is not None
    got = sorted((c, repr(v)) for _, c, v in tup.pending_writes or [])
    assert got == [("__error__", "'e2'"), ("__interrupt__", "['i2']"), ("x", "'first'")]


def test_put_writes_without_a_checkpoint_id_is_refused(saver: AgentWALSaver) -> None:
    with pytest.raises(ValueError, match="checkpoint_id"):
        saver.put_writes(cfg("t"), [("x", 1)], "task")
    assert saver.store.head("t") is None


# -- listing ----------------------------------------------------------------------------


def test_list_across_threads_and_namespaces_with_filter_before_and_limit(
        saver: AgentWALSaver) -> None:
    ids: dict[tuple[str, str], list[str]] = {}
    for thread in ("t1", "t2"):
        for ns in ("", "sub:1"):
            conf = cfg(thread, ns)
            for step in range(3):
                conf = saver.put(conf, checkpoint({}, {}), {"step": step, "source": "loop",
                                                            "owner": thread}, {})
                ids.setdefault((thread, ns), []).append(conf["configurable"]["checkpoint_id"])
    assert len(list(saver.list(None))) == 12
    assert len(list(saver.list(None, filter={"owner": "t2", "step": 1}))) == 2
    assert len(list(saver.list(None, limit=5))) == 5
    every_ns = [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg("t1") | {
        "configurable": {"thread_id": "t1"}})]
    assert sorted(every_ns, reverse=True) == every_ns and len(every_ns) == 6
    root = [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg("t1", ""))]
    assert root == ids[("t1", "")][::-1]
    before = list(saver.list(cfg("t1", ""), before=cfg("t1", "", ids[("t1", "")][2])))
    assert [t.config["configurable"]["checkpoint_id"] for t in before] == ids[("t1", "")][1::-1]
    one = list(saver.list(cfg("t1", "sub:1", ids[("t1", "sub:1")][1])))
    assert [t.checkpoint["id"] for t in one] == [ids[("t1", "sub:1")][1]]
    assert list(saver.list(None, filter={"owner": "nobody"})) == []


def test_other_runs_of_the_store_are_not_threads(saver: AgentWALSaver) -> None:
    with saver.store.begin("my-own-run") as txn:
        txn.put("x", 1)
    saver.put(cfg("t"), checkpoint({}, {}), {"step": 0}, {})
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"t"}
    saver.delete_thread("my-own-run")
    saver.prune(["my-own-run"])
    with pytest.raises(agentwal.RunExistsError):
        saver.copy_thread("t", "my-own-run")
    assert saver.store.state("my-own-run") == {"x": 1}


# -- values -----------------------------------------------------------------------------

RICH = {
    "messages": [HumanMessage("hi", id="1"), AIMessage("hello", id="2"),
                 ToolMessage("42", tool_call_id="c1", id="3")],
    "order": Order(sku="A-1", qty=2, placed=datetime.datetime(2026, 1, 2, 3, 4, 5,
                                                              tzinfo=datetime.timezone.utc)),
    "blob": b"\x00\xffbytes",
    "when": datetime.datetime(2026, 12, 1, 9, 30),
    "mixed": {"set": {1, 2}, "tuple": (1, "a"), "decimal": Decimal("1.25"), "none": None,
              "uuid": uuid.UUID(int=7)},
    "count": 3,
}


def test_rich_values_round_trip(saver: AgentWALSaver) -> None:
    versions = {k: saver.get_next_version(None, None) for k in RICH}
    stored = saver.put(cfg("t"), checkpoint(dict(RICH), versions), {"step": 1}, versions)
    tup = saver.get_tuple(stored)
    assert tup is not None
    # exactly what the serializer itself gives back (msgpack makes a tuple a list)
    assert tup.checkpoint["channel_values"] == {
        k: saver.serde.loads_typed(saver.serde.dumps_typed(v)) for k, v in RICH.items()}
    assert tup.checkpoint["channel_values"]["order"] == RICH["order"]
    assert tup.checkpoint["channel_versions"] == versions
    assert tup.metadata["step"] == 1


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.text(max_size=300), max_size=20), min_size=1, max_size=6))
def test_any_sequence_of_list_versions_reads_back(tmp_path_factory: Any,
                                                  versions: list[list[str]]) -> None:
    """Lists that grow, shrink, change in the middle or repeat all read back exactly."""
    store = agentwal.open(str(tmp_path_factory.mktemp("s") / "s.awal"), durability="none")
    saver = AgentWALSaver(store)
    chat = Chat(saver, "t")
    configs = []
    for texts in versions:
        chat.messages = []
        msgs = [HumanMessage(t * 8, id=str(i)) for i, t in enumerate(texts)]
        chat.version = saver.get_next_version(chat.version, None)
        cp = checkpoint({"messages": msgs}, {"messages": chat.version})
        chat.config = saver.put(chat.config, cp, {"step": 0}, {"messages": chat.version})
        configs.append((chat.config, msgs))
    for conf, msgs in configs:
        tup = saver.get_tuple(conf)
        assert tup is not None and tup.checkpoint["channel_values"]["messages"] == msgs
    store.close()


_STEPS = st.lists(st.tuples(st.sampled_from(["grow", "write", "edit", "shrink", "branch", "cold",
                                             "prune"]), st.integers(0, 200), st.integers(1, 60)),
                  min_size=1, max_size=20)


@settings(max_examples=25, deadline=None)
@given(_STEPS)
def test_pooled_lists_match_a_model_across_writes_edits_branches_cold_savers_and_prune(
        tmp_path_factory: Any, steps: list[tuple[str, int, int]]) -> None:
    """Every checkpoint's list reads back as put, through the saver that wrote it and a
    cold one, with chunks, runs and links made tiny so their edges are crossed often."""
    small = [(L, "POOL_CHUNK", 3), (L, "MAX_RUNS", 4), (L, "MAX_DEPTH", 3),
             (saver_module, "LIST_MIN_BYTES", 1), (saver_module, "WRITE_LIST_MIN_BYTES", 1)]
    with contextlib.ExitStack() as stack:
        for module, name, value in small:  # every list pooled
            stack.enter_context(mock.patch.object(module, name, value))
        store = stack.enter_context(agentwal.open(
            str(tmp_path_factory.mktemp("s") / "s.awal"), durability="none"))
        saver = AgentWALSaver(store)
        chat, made, saved = Chat(saver, "t"), 0, []

        def new(size: int) -> HumanMessage:
            nonlocal made
            made += 1
            return HumanMessage(f"m{made} " + "x" * (size * 10), id=f"id{made}")

        for op, a, size in steps:
            msgs = chat.messages
            if op == "grow":
                msgs = [*msgs, *[new(size) for _ in range(1 + a % 8)]]
            elif op == "write" and chat.config["configurable"].get("checkpoint_id"):
                msgs = [*msgs, new(size)]
                saver.put_writes(chat.config, [("messages", msgs[-1:])], f"task-{made}")
            elif op == "edit" and msgs:
                msgs = [*msgs[:a % len(msgs)], new(size), *msgs[a % len(msgs) + 1:]]
            elif op == "shrink":
                msgs = msgs[:a % (len(msgs) + 1)]
            elif op == "branch" and saved:
                chat.config, old = saved[a % len(saved)]
                msgs = [*old, new(size)]
            elif op == "cold":
                chat.saver = saver = AgentWALSaver(store)
            elif op == "prune":
                saver.prune(["t"])
                saved = [(c, m) for c, m in saved if saver.get_tuple(c) is not None]
            chat.version = saver.get_next_version(chat.version, None)
            chat.config = saver.put(chat.config, checkpoint(
                {"messages": msgs}, {"messages": chat.version}), {}, {"messages": chat.version})
            chat.messages = msgs
            saved.append((chat.config, msgs))
        for reader in (saver, AgentWALSaver(store)):
            for conf, msgs in saved:
                assert reader.get_tuple(conf).checkpoint["channel_values"]["messages"] == msgs
        assert store.verify().ok


def pools(store: agentwal.Store, thread: str) -> dict[str, list[Any]]:
    """A thread's pools by name, each its chunks' elements in order."""
    out: dict[str, list[Any]] = {}
    for key, chunk in sorted(store.state(thread).items()):
        if key.startswith("l/"):
            out.setdefault(L.pool_of_chunk(key), []).extend(chunk)
    return out


def test_an_append_grows_the_pool_by_the_new_message_and_a_small_record(
        saver: AgentWALSaver) -> None:
    chat = Chat(saver, "t")
    for i in range(40):
        chat.step(big(i), step=i)
    store = saver.store
    head = store.head("t")
    assert head is not None
    (key, pool), = pools(store, "t").items()
    assert len(pool) == 40 and not [k for k in store.state("t") if k.startswith("e/")]
    writes = store.diff("t", head.id - 2, head.id - 1)  # the last step: put_writes, then put
    assert list(writes.changed) == [L.chunk_key(key, 0)]  # the task's message, pooled
    write = store.get("t", next(k for k in writes.added if k.startswith("w/")))
    assert (write["t"], write["k"], write["s"]) == ("pool", key, [39, 40])
    put = store.diff("t", head.id - 1, head.id)
    assert key not in put.changed  # the checkpoint's list is the pool: nothing appended
    record = store.get("t", next(k for k in put.added if k.startswith("v/")))
    # the first 39 elements of the previous version, then the pool's last element
    assert (record["k"], record["s"], record["n"]) == (key, [39, 40], 39)
    assert record["b"] in store.state("t") and 0 < record["d"] < L.MAX_DEPTH
    # m1 was pooled by its write, m0 when the list reached the threshold, then m2..m39
    assert L.pool_positions(record, lambda k: store.get("t", k)) == [1, 0, *range(2, 40)]
    assert store.get("t", L.MARKER) == {"format": L.FORMAT}
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None and tup.checkpoint["channel_values"]["messages"] == chat.messages


def test_a_pool_longer_than_a_chunk_reads_back_and_a_cold_saver_continues_it(
        saver: AgentWALSaver) -> None:
    chat = Chat(saver, "t")
    configs = [chat.step(AIMessage(f"reply {i} " + "r" * 100, id=f"r{i}"), step=i)
               for i in range(150)]
    store = saver.store
    chunks = sorted((k, len(v)) for k, v in store.state("t").items() if k.startswith("l/"))
    assert [n for _, n in chunks][:2] == [L.POOL_CHUNK, L.POOL_CHUNK] and len(chunks) == 3
    cold = AgentWALSaver(store)  # nothing cached: learns the pool from the parent's version
    for i in (0, 63, 64, 100, 149):
        got = cold.get_tuple(configs[i]).checkpoint["channel_values"]["messages"]
        assert [m.id for m in got] == [f"r{j}" for j in range(i + 1)]
    chat.saver = cold
    chat.step(AIMessage("one more " + "r" * 100, id="r150"))
    (pool,) = pools(store, "t").values()
    assert len(pool) == 151  # nothing stored twice
    assert cold.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"] == chat.messages


@pytest.mark.parametrize("unknown", ["a new saver", "the cached pool dropped"])
def test_a_write_saved_before_its_checkpoint_by_a_saver_not_knowing_the_pool_keeps_it(
        saver: AgentWALSaver, unknown: str) -> None:
    """Under LangGraph's default durability ("async") a step's checkpoint is saved in the
    background while its task runs, so the task's write can land first. A saver that does
    not know the thread's pool then (a new process; or a warm one, after a commit that met
    a grown pool dropped it and another commit is reading it again) learns it from the
    namespace's newest checkpoint: it must not start a new pool, which the next checkpoint
    would fill with the whole conversation again (issue #13: a late turn of ~60 KiB)."""
    chat = Chat(saver, "t")
    for i in range(80):
        chat.step(big(i), step=i)
    store = saver.store
    if unknown == "a new saver":
        saver = AgentWALSaver(store)
    else:  # the state _StalePool leaves while another commit reads the pool again
        saver._shared.forget_pool(("t", L.ROOT, "messages"))
    # the next step: its checkpoint (the last task's message added) is still being saved
    # in the background when the step's task saves its write, a new message
    version = saver.get_next_version(chat.version, None)
    messages = [*chat.messages, big(80)]
    cp = checkpoint({"messages": messages}, {"messages": version})
    at = cfg("t", "", cp["id"])
    saver.put_writes(at, [("messages", [big(81)])], "task")
    saver.put(chat.config, cp, {"source": "loop", "step": 80}, {"messages": version})
    after = saver.get_next_version(version, None)
    cp = checkpoint({"messages": [*messages, big(81)]}, {"messages": after})
    saver.put(at, cp, {"source": "loop", "step": 81}, {"messages": after})
    found = pools(store, "t")
    assert [len(p) for p in found.values()] == [82]  # one pool, each message in it once
    (pool,) = found.values()
    assert sorted(saver.serde.loads_typed((e["t"], e["b"])).id for e in pool) == sorted(
        f"m{i}" for i in range(82))
    got = saver.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"]
    assert [m.id for m in got] == [f"m{i}" for i in range(82)]


def test_a_message_replaced_in_the_middle_is_stored_and_read_back(saver: AgentWALSaver) -> None:
    chat = Chat(saver, "t")
    for i in range(6):
        chat.step(big(i))
    first = chat.config
    chat.messages = [*chat.messages[:2], AIMessage("edited " * 300, id="m2"), *chat.messages[3:]]
    chat.step(big(6))
    assert saver.get_tuple(chat.config).checkpoint["channel_values"]["messages"] == chat.messages
    assert len(saver.get_tuple(first).checkpoint["channel_values"]["messages"]) == 6


# -- concurrency, copies, serializers, reopen --------------------------------------------


def test_concurrent_threads_and_parallel_task_writes(saver: AgentWALSaver) -> None:
    errors: list[BaseException] = []

    def conversation(n: int) -> None:
        try:
            chat = Chat(saver, f"t{n}")
            for i in range(15):
                chat.step(big(i), step=i)
                # parallel tasks of one super-step write to the same checkpoint at once (their
                # notes race to append to one pool: conflicts and retries)
                tasks = [threading.Thread(target=saver.put_writes, args=(
                    chat.config, [("out", f"{n}-{i}-{k}"), ("notes", [big(100 * k + i)])],
                    f"task-{k}")) for k in range(3)]
                for t in tasks:
                    t.start()
                for t in tasks:
                    t.join()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=conversation, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    for n in range(4):
        tup = saver.get_tuple(cfg(f"t{n}"))
        assert tup is not None
        assert [m.id for m in tup.checkpoint["channel_values"]["messages"]] == [
            f"m{i}" for i in range(15)]
        writes = tup.pending_writes or []
        assert sorted(v for _, c, v in writes if c == "out") == [f"{n}-14-{k}" for k in range(3)]
        assert sorted(v[0].id for _, c, v in writes if c == "notes") == sorted(
            f"m{100 * k + 14}" for k in range(3))
        assert len(list(saver.list(cfg(f"t{n}")))) == 15


def test_with_allowlist_copy_shares_the_store_and_caches(path: str) -> None:
    store = agentwal.open(path, durability="none")
    saver = AgentWALSaver(store, serde=JsonPlusSerializer(allowed_msgpack_modules=[]))
    clone = saver.with_allowlist([("tests.langgraph.test_saver", "Order")])
    assert clone is not saver and clone.store is saver.store and clone.serde is not saver.serde
    chat = Chat(clone, "t")
    for i in range(5):
        chat.step(big(i))
    Chat.step(Chat(saver, "u"), big(0))
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == 5
    assert {t.config["configurable"]["thread_id"] for t in clone.list(None)} == {"t", "u"}
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    conf = clone.put(cfg("o"), checkpoint({"o": Order(sku="s", qty=1, placed=when)},
                                         {"o": "1"}), {}, {"o": "1"})
    assert clone.get_tuple(conf).checkpoint["channel_values"]["o"].sku == "s"
    store.close()


class XorCipher:
    """A test cipher: a SHA-256 counter-mode keystream (for tests only)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def _stream(self, n: int) -> bytes:
        out = b"".join(hashlib.sha256(self.key + i.to_bytes(8, "big")).digest()
                       for i in range(n // 32 + 1))
        return out[:n]

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor-sha256", bytes(a ^ b for a, b in zip(plaintext, self._stream(len(plaintext)),
                                                        strict=True))

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor-sha256"
        return self.encrypt(ciphertext)[1]


def test_encrypted_serializer_stores_its_tag_and_no_plaintext(path: str) -> None:
    serde = EncryptedSerializer(XorCipher(b"k" * 16), JsonPlusSerializer())
    with AgentWALSaver.from_path(path, serde=serde, durability="none") as saver:
        chat = Chat(saver, "t")
        for i in range(4):
            chat.step(AIMessage(f"secret-{i} " * 200, id=f"m{i}"))
        state = saver.store.state("t")
        assert {v["t"] for k, v in state.items() if k.startswith("w/")} == {"pool"}
        (pool,) = pools(saver.store, "t").values()
        assert {e["t"] for e in pool} == {"msgpack+xor-sha256"}
        assert "secret" not in repr(state)
        tup = saver.get_tuple(cfg("t"))
        assert tup is not None and tup.checkpoint["channel_values"]["messages"] == chat.messages
    with (AgentWALSaver.from_path(path, durability="none") as plain_reader,  # wrong serde
          pytest.raises(Exception)):  # noqa: B017 - whatever the serializer raises
        plain_reader.get_tuple(cfg("t"))


def test_reopen_reads_everything_and_keeps_sharing(path: str) -> None:
    with AgentWALSaver.from_path(path, durability="sync") as saver:
        chat = Chat(saver, "t")
        for i in range(10):
            chat.step(big(i), step=i)
        before = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(cfg("t"))]
    with AgentWALSaver.from_path(path) as saver:
        assert [(t.checkpoint, t.metadata, t.pending_writes)
                for t in saver.list(cfg("t"))] == before
        chat.saver = saver
        chat.step(big(10), step=10)  # a cold cache learns the pool from the parent
        chat.step(big(11), step=11)
        (pool,) = pools(saver.store, "t").values()  # each message once: none stored again
        assert sorted(saver.serde.loads_typed((e["t"], e["b"])).id for e in pool) == sorted(
            m.id for m in chat.messages)
        assert saver.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"] == \
            chat.messages


def test_copy_thread_into_an_existing_thread_merges(saver: AgentWALSaver) -> None:
    a, b = Chat(saver, "a"), Chat(saver, "b")
    for i in range(3):
        a.step(big(i))
        b.step(big(10 + i))
    saver.copy_thread("a", "b")
    assert len(list(saver.list(cfg("b")))) == 6
    newest = max(a.config["configurable"]["checkpoint_id"],
                 b.config["configurable"]["checkpoint_id"])
    assert saver.get_tuple(cfg("b")).checkpoint["id"] == newest


def test_prune_keep_latest_keeps_a_whole_list_and_drops_the_rest(saver: AgentWALSaver) -> None:
    chat = Chat(saver, "t")
    for i in range(30):
        chat.step(big(i))
    saver.put_writes(chat.config, [("messages", [big(99)])], "task-x")  # pending on the head
    saver.prune(["t"])
    assert len(list(saver.list(cfg("t")))) == 1
    state = saver.store.state("t")
    assert [len(p) for p in pools(saver.store, "t").values()] == [31]
    assert saver.get_tuple(cfg("t")).pending_writes == [("task-x", "messages", [big(99)])]
    assert sum(1 for k in state if k.startswith("v/")) == 1
    assert saver.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"] == chat.messages
    chat.step(big(99))  # the cache was forgotten: the next version still reads back
    assert saver.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"] == chat.messages
    with pytest.raises(ValueError, match="strategy"):
        saver.prune(["t"], strategy="oldest")


def test_delete_for_runs_keeps_the_values_other_checkpoints_need(saver: AgentWALSaver) -> None:
    chat = Chat(saver, "t")
    for i in range(5):
        chat.step(big(i), run_id="r1")
    for i in range(5, 8):
        chat.step(big(i), run_id="r2")
    saver.delete_for_runs(["r1"])
    left = list(saver.list(cfg("t")))
    assert {t.metadata["run_id"] for t in left} == {"r2"}
    assert left[0].checkpoint["channel_values"]["messages"] == chat.messages


# -- the store's own view of a thread -------------------------------------------------------


def test_cli_shows_threads_metadata_and_decoded_values(path: str) -> None:
    with AgentWALSaver.from_path(path, durability="none") as saver:
        chat = Chat(saver, "chat-1")
        for i in range(3):
            chat.step(HumanMessage(f"question number {i} " * 120, id=f"q{i}"), step=i)
    runner = CliRunner()
    runs = runner.invoke(cli, ["runs", path, "--json"])
    assert runs.exit_code == 0 and "chat-1" in runs.output
    hist = runner.invoke(cli, ["history", path, "chat-1", "--json"])
    assert hist.exit_code == 0
    metas = [c["meta"] for c in json.loads(hist.output)]
    steps = [m["metadata"]["step"] for m in metas if m.get("langgraph") == "checkpoint"]
    assert sorted(steps) == [0, 1, 2]
    shown = runner.invoke(cli, ["show", path, "chat-1", "--json"])
    assert shown.exit_code == 0
    assert "question number 2" in shown.output and "HumanMessage" in shown.output


# -- async never blocks the loop ------------------------------------------------------------


class ThreadSpy:
    """A store proxy that records which thread each storage call ran on."""

    def __init__(self, store: agentwal.Store) -> None:
        self._store = store
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.threads.add(threading.get_ident())
            return attr(*args, **kwargs)

        return call


def test_async_methods_run_storage_off_the_event_loop(path: str) -> None:
    store = agentwal.open(path, durability="sync")
    spy = ThreadSpy(store)
    saver = AgentWALSaver(spy)  # type: ignore[arg-type]

    async def main() -> int:
        conf = await saver.aput(cfg("t"), checkpoint({"x": 1}, {"x": "1"}), {"step": 0},
                                {"x": "1"})
        await saver.aput_writes(conf, [("y", 2)], "task")
        assert (await saver.aget_tuple(conf)) is not None
        assert len([t async for t in saver.alist(None)]) == 1
        await saver.acopy_thread("t", "u")
        await saver.adelete_for_runs(["none"])
        await saver.aprune(["u"])
        await saver.adelete_thread("u")
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    store.close()
    assert spy.threads and loop_thread not in spy.threads


def test_importing_without_langgraph_names_the_extra() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'langgraph' or name.startswith('langgraph.'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        "    import agentwal.integrations.langgraph\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "agentwal[langgraph]" in out


def test_agentwal_compaction_keeps_what_langgraph_reads(saver: AgentWALSaver) -> None:
    chat = Chat(saver, "t")
    for i in range(40):
        chat.step(big(i), step=i)
    before = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(cfg("t"))]
    report = saver.store.compact(keep_last=1, vacuum=True)
    assert report.checkpoints_dropped > 0 and len(saver.store.history("t")) == 1
    assert [(t.checkpoint, t.metadata, t.pending_writes)
            for t in saver.list(cfg("t"))] == before
    chat.step(big(40))
    assert saver.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"] == chat.messages
