"""On-disk format constants: the one module that says where every byte goes.

``docs/format.md`` documents these tables with a worked example, and the
golden files in ``tests/data/`` pin them: a change here must bump
``FORMAT_VERSION`` and update both.

Format versions (the segment header's version field and CONTROL's ``format``):
1 is a log of form-1 commit records only; 2 is a log that may hold form-2
records (``FLAG_APPENDS``, docs/format.md section 5a); 3 is a store whose
snapshot a layout-4 fold may have written (docs/format.md section 7), its log
read as version 2. An agentwal that reads only version 1 refuses a version-2
store or segment instead of taking the first form-2 frame for the end of the
log; one that reads only 1 and 2 refuses a version-3 store instead of reading
a layout-4 snapshot's history wrong. A store is written in version 1 until
its first form-2 record or its first fold, so it stays openable by such an
agentwal until then.

Segment header (``SEGMENT_HEADER_SIZE`` bytes, little-endian)::

    off  size  field
    0    8     magic  b"AWALSEG\\0"
    8    2     format version (1, or 2 once the log may hold form-2 records)
    10   2     flags (0)
    12   4     header size (64)
    16   16    store id (UUID bytes)
    32   8     segment number (0, 1, 2 ...)
    40   8     first LSN the segment holds
    48   4     salt (random per segment; seeds every record CRC)
    52   8     reserved (zero)
    60   4     CRC-32 of bytes 0..59

Record frame (``RECORD_HEADER_SIZE`` bytes, then the payload)::

    off  size  field
    0    4     CRC-32 seeded with the segment salt, over bytes 4..27 + payload
    4    4     payload length (>= 1)
    8    8     LSN (previous + 1)
    16   8     synced LSN: the highest LSN the writer knew durable when it wrote this
    24   1     record type (1 commit, 2 effect entry, 3 run deletion)
    25   1     flags (bit 0: the commit's delta / the effect entry is zstd-compressed;
                 bit 1: the commit's delta may hold append entries)
    26   2     reserved (zero)
"""

from __future__ import annotations

import struct

#: The newest format version: what a store this agentwal has folded is written in.
FORMAT_VERSION = 3
#: Every format version this agentwal reads.
READ_VERSIONS = frozenset({1, 2, 3})
#: The version a store (its CONTROL and its segments) is written in until its log holds
#: a form-2 record.
PLAIN_VERSION = 1
#: The first version whose segments may hold form-2 commit records.
APPENDS_VERSION = 2
#: The first version whose snapshot a layout-4 fold may have written (write-once keys
#: without a ``versions`` entry, plain leaves): CONTROL says it before the first fold
#: that writes the snapshot's ``layout`` marker. Its log reads as version 2.
LAYOUT4_VERSION = 3

SEGMENT_MAGIC = b"AWALSEG\x00"
SEGMENT_HEADER = struct.Struct("<8sHHI16sQQI8s")  # without the trailing CRC
SEGMENT_HEADER_SIZE = 64
SEGMENT_SUFFIX = ".wal"
#: Suffix of a segment still being created (removed by recovery).
TMP_SUFFIX = ".tmp"

RECORD_HEADER = struct.Struct("<IIQQBBH")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 28

#: Record types.
REC_COMMIT = 1
#: An effects-ledger entry (the whole entry; the last record of a key wins).
REC_EFFECT = 2
#: ``store.delete_run``: CBOR ``[run, head id]``; hides the run, the next fold removes it.
REC_DELETE_RUN = 3
RECORD_TYPES = frozenset({REC_COMMIT, REC_EFFECT, REC_DELETE_RUN})

#: Record flags.
FLAG_ZSTD = 0x01
#: A commit whose delta may hold *append entries* ``[base count, base length, tail]``
#: beside whole values (``txn.append``, a re-put that extends the list it read): the
#: record's form 2. A commit without it is form 1 (every entry a whole value or None).
FLAG_APPENDS = 0x02
KNOWN_FLAGS = FLAG_ZSTD | FLAG_APPENDS

#: Largest payload a frame may carry; a bigger length field is damage.
MAX_RECORD_PAYLOAD = 1 << 30
#: Deltas at least this long are zstd-compressed (when that makes them smaller).
COMPRESS_THRESHOLD = 256
#: Largest decompressed delta accepted from disk.
MAX_DECOMPRESSED = 1 << 31
#: Deepest CBOR nesting accepted from disk.
MAX_CBOR_DEPTH = 256

#: Default nominal segment size (segments are preallocated with zeros).
DEFAULT_SEGMENT_BYTES = 16 << 20
#: With the default segment size, the first segment's size; each next one doubles.
FIRST_SEGMENT_BYTES = 64 << 10
MIN_SEGMENT_BYTES = 4096

CONTROL_FILE = "CONTROL"
WAL_DIR = "wal"
SNAPSHOT_DIR = "snapshot"

assert SEGMENT_HEADER.size + 4 == SEGMENT_HEADER_SIZE
assert RECORD_HEADER_SIZE == 28


def segment_name(first_lsn: int) -> str:
    """File name of the segment whose first record has LSN ``first_lsn``."""
    return f"{first_lsn:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The first LSN encoded in a segment file name, or None if it is not one."""
    stem = name[: -len(SEGMENT_SUFFIX)]
    if not name.endswith(SEGMENT_SUFFIX) or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


# -- blobs (txn.put_blob) ---------------------------------------------------------------

#: Directory of the content-addressed blob files: ``blobs/<sha[:2]>/<sha[2:]>``.
BLOBS_DIR = "blobs"
#: Directory under ``blobs/`` of blob files being written (``<random hex>.tmp``).
BLOB_TMP_DIR = "tmp"
#: CBOR tag of a blob reference, the whole stored value of a key put with
#: ``txn.put_blob``: ``tag(BLOB_TAG, [sha256 (32-byte bstr), size (uint)
#: (, media type (text))])``. The number spells ``awbl`` in ASCII.
BLOB_TAG = 0x6177626C
#: The bytes every blob reference starts with: the tag's CBOR head.
BLOB_REF_PREFIX = b"\xda" + BLOB_TAG.to_bytes(4, "big")
#: Longest media type a blob reference may carry, in UTF-8 bytes.
MAX_MEDIA_TYPE_BYTES = 255


# -- trees (txn.put_tree) ----------------------------------------------------------------

#: Media type of the blob reference a key put with ``txn.put_tree`` holds: the
#: reference names the tree's *root object* (itself a blob). Reserved: put_blob
#: refuses it. See docs/format.md, "Trees".
TREE_MEDIA_TYPE = "application/vnd.agentwal.tree"
#: First field of a directory object: ``["awtree", TREE_VERSION, entries]``.
TREE_MAGIC = "awtree"
#: First field of a root object: ``["awroot", TREE_VERSION, dir sha, dir size,
#: files, bytes, exclude patterns, gitignore flag]``.
TREE_ROOT_MAGIC = "awroot"
#: Version of the tree and root object encodings.
TREE_VERSION = 1
#: Entry kinds in a directory object.
TREE_FILE, TREE_LINK, TREE_DIR = 0, 1, 2
#: Directory of caches under the store (not state: deleting it only costs time).
CACHE_DIR = "cache"
