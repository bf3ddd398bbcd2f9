"""The core every snapshot read stands on: one LMDB transaction and its sealed values.

Theory of operation: a :class:`ReaderBase` holds one LMDB transaction and
the database handles. :meth:`_open` unseals a value (its CRC-32 over key and
bytes checked) and :meth:`_load` decodes it; :meth:`_reading` turns an LMDB
failure while reading into damage to the file (:func:`env.translate` with
``reading=True``). The history reads (``history_reads.py``), the ledger reads
(``ledger_reads.py``) and :class:`~.reader.SnapshotReader` are built on it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...codec import CodecError, loads
from ...errors import CorruptionError
from .env import Error, translate
from .layout import CRC, DATA, Dbs, crc

if TYPE_CHECKING:
    from .reader import HeadLists

__all__ = ["ReaderBase"]


class ReaderBase:
    """One LMDB transaction (``txn``) and the checked accessors of its sealed values."""

    def __init__(self, directory: str, dbs: Dbs, txn: Any,
                 lists: HeadLists | None = None) -> None:
        self.directory = directory
        self._lists = lists
        self._txn = txn
        self._dbs = dbs
        (self._meta, self._runs, self._state, self._ckpt, self._effects, self._delta,
         self._manifest, self._objects, self._refs, self._oids, self._versions) = dbs
        self._indexed: bool | None = None  # the history index marker, once read

    # -- sealed values ----------------------------------------------------------------

    def _corrupt(self, what: str) -> CorruptionError:
        return CorruptionError(os.path.join(self.directory, DATA), None, what)

    def _open(self, key: bytes, raw: bytes | None, what: str) -> bytes | None:
        if raw is None:
            return None
        if len(raw) < 4 or CRC.unpack_from(raw)[0] != crc(key, raw[4:]):
            raise self._corrupt(f"checksum mismatch in {what}")
        return bytes(raw[4:])

    def _load(self, key: bytes, raw: bytes | None, what: str) -> Any:
        data = self._open(key, raw, what)
        if data is None:
            return None
        try:
            return loads(data)
        except CodecError as exc:
            raise self._corrupt(f"{what}: {exc}") from None

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Turn LMDB failures while reading into agentwal errors."""
        try:
            yield
        except Error as exc:
            raise translate(exc, self.directory, f"cannot read {what}", reading=True) from None

