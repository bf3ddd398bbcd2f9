"""The store's tables, and the migrations that create and upgrade them.

Theory of operation: a store is one PostgreSQL schema. ``meta`` holds its
identity and ``schema_version``; :data:`MIGRATIONS` is the ordered list of
steps, step ``i`` taking version ``i`` to ``i + 1``. :func:`install` runs every
missing step in one transaction under ``pg_advisory_xact_lock`` keyed by the
schema name, so workers opening a new store at the same moment serialize
there and exactly one creates it (the others find it made). A stored version
newer than :data:`VERSION` is refused (:class:`SchemaVersionError`) before
anything is touched; :func:`check` (read-only opens) never writes.

Tables (version 1):

- ``runs``: one row per run id ever leased or written, never deleted (its
  ``lease_epoch``, the fencing token, must never go back): the head and the
  hash-chain tip, ``run_epoch`` (the commit sequence number of the run id's
  last deletion), and the lease (owner, epoch, expiry by the server's clock).
  Commits and renewals rewrite it, so it has no index on those columns and
  ``fillfactor = 50``: the updates stay HOT. ``steals`` counts the
  takeovers since the run's last commit; ``parked_at``/``parked_why``
  (version 2) mark a poison run no worker may lease.
- ``checkpoints``: one row per commit, with what ``codec.checkpoint_hash``
  covers, the lease epoch that wrote it and a unique ``commit_token`` (a
  commit whose reply was lost is looked up by it); ``dropped`` (version 5)
  marks one ``compact`` removed (its row stays for the chain).
- ``deltas`` + ``vals``: the keys each commit changed; values over
  :data:`INLINE_MAX` bytes are stored once in ``vals`` by SHA-256, so storage is
  O(delta) and equal values are shared across checkpoints, keys and runs.
  ``until`` (version 4) is the checkpoint that next wrote the row's key
  (NULL: the key's latest row), so reading a checkpoint's state scans no
  history (``backend``). ``base`` (version 7) marks an append row: it holds
  the items appended to its key's row at checkpoint ``base`` (append-shared
  lists: a growing list costs its new items per commit).
- ``effects``: the effects ledger (``effects.encode_entry`` bytes per key).
- ``blobs``, ``blob_chunks``, ``delta_blobs`` (version 3): blob content in
  chunks, and the checkpoints whose values reference each blob (``blobs.py``).
- ``tree_edges`` (version 6): ``(parent, child)`` for each entry of each
  directory tree object (a tree's root object names its top directory, a
  directory its files and subdirectories), recorded when a tree is put
  (``trees.py``); collection keeps a blob reachable from a referenced one.

Functions (version 8): ``write_checkpoint`` writes a commit's rows and
``commit_step`` is a plain step's whole commit, guard included (their
comments below; ``backend`` calls them).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from ..errors import SchemaVersionError, StoreNotFoundError

__all__ = ["INLINE_MAX", "MIGRATIONS", "VERSION", "check", "install"]

#: Encoded values up to this many bytes are stored in the delta row itself.
INLINE_MAX = 64

_V1 = """
CREATE TABLE meta (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    store_id       uuid NOT NULL,
    schema_version integer NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE SEQUENCE commit_seq;
CREATE TABLE runs (
    run           text COLLATE "C" PRIMARY KEY,
    head          bigint NOT NULL DEFAULT 0,
    head_hash     bytea,
    run_epoch     bigint NOT NULL DEFAULT 0,
    lease_owner   text,
    lease_epoch   bigint NOT NULL DEFAULT 0,
    lease_expires timestamptz,
    steals        integer NOT NULL DEFAULT 0
) WITH (fillfactor = 50);
CREATE TABLE vals (
    digest bytea PRIMARY KEY,
    data   bytea NOT NULL
);
CREATE TABLE checkpoints (
    run           text COLLATE "C" NOT NULL REFERENCES runs,
    id            bigint NOT NULL,
    parent        bigint,
    seq           bigint NOT NULL,
    created_at    double precision NOT NULL,
    meta          bytea NOT NULL,
    hash          bytea NOT NULL,
    delta_digest  bytea NOT NULL,
    outbox        bytea,
    origin_run    text,
    origin_id     bigint,
    lease_epoch   bigint NOT NULL,
    commit_token  uuid NOT NULL UNIQUE,
    PRIMARY KEY (run, id)
);
CREATE TABLE deltas (
    run    text COLLATE "C" NOT NULL,
    ckpt   bigint NOT NULL,
    key    text COLLATE "C" NOT NULL,
    inline bytea,
    digest bytea REFERENCES vals,
    PRIMARY KEY (run, ckpt, key),
    FOREIGN KEY (run, ckpt) REFERENCES checkpoints ON DELETE CASCADE
);
CREATE INDEX deltas_by_key ON deltas (run, key, ckpt DESC);
CREATE TABLE effects (
    key     text COLLATE "C" PRIMARY KEY,
    run     text COLLATE "C" NOT NULL,
    ckpt    bigint NOT NULL,
    ordinal integer,
    entry   bytea NOT NULL
);
CREATE INDEX effects_by_position ON effects (run, ckpt, ordinal);
"""

# Poison runs: a run whose lease was taken over ``max_steals`` times without a
# commit is parked (``leases``) until an operator unparks it.
_V2 = """
ALTER TABLE runs ADD COLUMN parked_at timestamptz, ADD COLUMN parked_why text;
"""

# Blobs (``blobs.py``): content-addressed rows streamed in chunks, and which
# checkpoints reference each (collection and verify read it).
_V3 = """
CREATE TABLE blobs (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sha256     bytea UNIQUE,
    size       bigint NOT NULL,
    touched_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE blob_chunks (
    blob bigint NOT NULL REFERENCES blobs ON DELETE CASCADE,
    n    integer NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (blob, n)
);
ALTER TABLE blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE delta_blobs (
    run    text COLLATE "C" NOT NULL,
    ckpt   bigint NOT NULL,
    sha256 bytea NOT NULL REFERENCES blobs (sha256),
    PRIMARY KEY (run, ckpt, sha256),
    FOREIGN KEY (run, ckpt) REFERENCES checkpoints ON DELETE CASCADE
);
CREATE INDEX delta_blobs_by_blob ON delta_blobs (sha256);
"""

# Reads that scan no history: each delta row records the checkpoint that
# superseded it (``until``; NULL while live), filled in for existing rows.
_V4 = """
ALTER TABLE deltas ADD COLUMN until bigint;
UPDATE deltas d SET until = n.next
  FROM (SELECT run, key, ckpt, lead(ckpt) OVER (PARTITION BY run, key ORDER BY ckpt) AS next
          FROM deltas) n
 WHERE d.run = n.run AND d.key = n.key AND d.ckpt = n.ckpt AND n.next IS NOT NULL;
CREATE UNIQUE INDEX deltas_live ON deltas (run, key) WHERE until IS NULL;
CREATE INDEX deltas_superseded ON deltas (run, until) WHERE until IS NOT NULL;
"""

# Compaction (``compact``): a dropped checkpoint keeps its row, marked; the
# values its deleted rows named are found by digest.
_V5 = """
ALTER TABLE checkpoints ADD COLUMN dropped boolean NOT NULL DEFAULT false;
CREATE INDEX deltas_by_digest ON deltas (digest) WHERE digest IS NOT NULL;
"""

# Directory trees (``trees.py``): which blobs each tree object names, so a
# blob a committed tree reaches is never collected.
_V6 = """
CREATE TABLE tree_edges (
    parent bytea NOT NULL REFERENCES blobs (sha256) ON DELETE CASCADE,
    child  bytea NOT NULL REFERENCES blobs (sha256),
    PRIMARY KEY (parent, child)
);
CREATE INDEX tree_edges_by_child ON tree_edges (child);
"""

# Append-shared lists (``backend``): a delta row may hold only the items a
# commit appended to the list its key's previous row holds (``base``: that
# row's checkpoint; ``base_count``/``base_len``: that list's item count and
# encoded length); ``depth`` counts the append rows behind it and ``vlen`` is
# the whole value's length (NULL in older rows: their next write is whole).
_V7 = """
ALTER TABLE deltas ADD COLUMN base bigint, ADD COLUMN base_count bigint,
    ADD COLUMN base_len bigint, ADD COLUMN depth integer NOT NULL DEFAULT 0,
    ADD COLUMN vlen bigint;
"""

# A commit's writes as server-side functions (``backend``), so the client sends
# one statement per commit instead of one per row.
#
# ``write_checkpoint`` writes a checkpoint's rows in the caller's transaction:
# the values (``p_vals``: ``[[digest, data], ...]``, inserted in digest order so
# two commits never lock ``vals`` rows in opposite orders), the checkpoint, the
# end of each written key's live row (one index lookup per key: a join could
# be planned as a scan of the run's rows), the delta rows (``p_rows``: ``[[key,
# inline, digest, base, base count, base length, depth, value length], ...]``),
# the blobs they reference (``p_blobs``: ``[sha256, ...]``; the foreign key
# fails the commit if one is gone) and the run's new head. Byte strings travel
# as hex inside the JSON: one text parameter the client encodes in C, where a
# parameter per row or an array is dumped element by element in Python.
#
# ``commit_step`` is the one-statement commit of a plain step: under the run's
# row lock it checks that the head, the run epoch and the lease (owner, epoch,
# not expired by the server's clock) are what the client assumed, then takes a
# commit sequence number and writes; it returns that number, or NULL, having
# written nothing, when one of them is not as assumed.
_V8 = """
CREATE FUNCTION write_checkpoint(
    p_run text, p_id bigint, p_parent bigint, p_seq bigint, p_created double precision,
    p_meta bytea, p_hash bytea, p_delta_digest bytea, p_outbox bytea, p_origin_run text,
    p_origin_id bigint, p_lease_epoch bigint, p_token uuid,
    p_vals json, p_rows json, p_blobs json) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    k text;
BEGIN
    INSERT INTO vals (digest, data)
    SELECT decode(v->>0, 'hex'), decode(v->>1, 'hex') FROM json_array_elements(p_vals) v
     ORDER BY 1
    ON CONFLICT (digest) DO NOTHING;
    INSERT INTO checkpoints (run, id, parent, seq, created_at, meta, hash, delta_digest,
                             outbox, origin_run, origin_id, lease_epoch, commit_token)
    VALUES (p_run, p_id, p_parent, p_seq, p_created, p_meta, p_hash, p_delta_digest,
            p_outbox, p_origin_run, p_origin_id, p_lease_epoch, p_token);
    FOR k IN SELECT r->>0 FROM json_array_elements(p_rows) r LOOP
        UPDATE deltas SET until = p_id WHERE run = p_run AND key = k AND until IS NULL;
    END LOOP;
    INSERT INTO deltas (run, ckpt, key, inline, digest, base, base_count, base_len, depth,
                        vlen)
    SELECT p_run, p_id, r->>0, decode(r->>1, 'hex'), decode(r->>2, 'hex'),
           (r->>3)::bigint, (r->>4)::bigint, (r->>5)::bigint, (r->>6)::integer,
           (r->>7)::bigint
      FROM json_array_elements(p_rows) r;
    INSERT INTO delta_blobs (run, ckpt, sha256)
    SELECT p_run, p_id, decode(b, 'hex') FROM json_array_elements_text(p_blobs) b;
    UPDATE runs SET head = p_id, head_hash = p_hash, steals = 0 WHERE run = p_run;
END
$fn$;

CREATE FUNCTION commit_step(
    p_run text, p_base bigint, p_run_epoch bigint, p_owner text, p_lease_epoch bigint,
    p_created double precision, p_meta bytea, p_hash bytea, p_delta_digest bytea,
    p_token uuid, p_vals json, p_rows json, p_blobs json) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    r runs%ROWTYPE;
    s bigint;
BEGIN
    SELECT * INTO r FROM runs WHERE run = p_run FOR UPDATE;
    IF NOT FOUND OR r.head <> p_base OR r.run_epoch <> p_run_epoch
            OR r.lease_owner IS DISTINCT FROM p_owner OR r.lease_epoch <> p_lease_epoch
            OR NOT coalesce(r.lease_expires > clock_timestamp(), false) THEN
        RETURN NULL;
    END IF;
    s := nextval('commit_seq');
    PERFORM write_checkpoint(p_run, p_base + 1, nullif(p_base, 0), s, p_created, p_meta,
                             p_hash, p_delta_digest, NULL, NULL, NULL, p_lease_epoch,
                             p_token, p_vals, p_rows, p_blobs);
    RETURN s;
END
$fn$;
"""

#: Step ``i`` takes the schema from version ``i`` to ``i + 1``.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8)
#: The newest schema version this code knows.
VERSION = len(MIGRATIONS)


def _stored(conn: psycopg.Connection[Any], schema: str) -> tuple[int, uuid.UUID | None]:
    """``(schema_version, store_id)`` as stored; ``(0, None)`` for no store."""
    row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".meta',)).fetchone()
    if row is None or row[0] is None:
        return 0, None
    got = conn.execute(f'SELECT schema_version, store_id FROM "{schema}".meta').fetchone()
    if got is None:
        return 0, None
    return int(got[0]), got[1]


def _refuse_newer(where: str, version: int) -> None:
    if version > VERSION:
        raise SchemaVersionError(where, version, VERSION)


def install(conn: psycopg.Connection[Any], schema: str, where: str, *,
            create: bool = True) -> uuid.UUID:
    """Create (unless not ``create``) or upgrade the store in ``schema``; returns its store id.

    Raises:
        SchemaVersionError: the stored schema is newer than this code (nothing changed).
        StoreNotFoundError: not ``create`` and there is no store in ``schema`` (nothing made).
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                     (f"agentwal-migrate:{schema}",))
        version, store_id = _stored(conn, schema)
        if store_id is None and not create:
            raise _no_store(where, "this open never creates one")
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        _refuse_newer(where, version)
        conn.execute(f'SET LOCAL search_path = "{schema}"')
        for step in range(version, VERSION):
            conn.execute(MIGRATIONS[step])
            if step == 0:
                store_id = uuid.uuid4()
                conn.execute("INSERT INTO meta (store_id, schema_version) VALUES (%s, %s)",
                             (store_id, step + 1))
            else:
                conn.execute("UPDATE meta SET schema_version = %s", (step + 1,))
    assert store_id is not None
    return store_id


def _no_store(where: str, why: str) -> StoreNotFoundError:
    return StoreNotFoundError(where, "no store here (no agentwal tables in this schema)",
                              f"Check the URI's schema; {why}.")


def check(conn: psycopg.Connection[Any], schema: str, where: str) -> uuid.UUID:
    """The store id of the store in ``schema``, for a read-only open; writes nothing.

    Raises:
        StoreNotFoundError: there is no store in ``schema``.
        SchemaVersionError: the schema is newer than this code, or older (a
            read-only open does not migrate).
    """
    version, store_id = _stored(conn, schema)
    if store_id is None:
        raise _no_store(where, "a read-only open never creates one")
    _refuse_newer(where, version)
    if version < VERSION:
        raise SchemaVersionError(where, version, VERSION)
    return store_id
