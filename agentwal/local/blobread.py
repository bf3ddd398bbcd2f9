"""Reading a blob: a read-only stream that checks the content's SHA-256 as it goes.

Theory of operation: ``store.open_blob`` (through ``BlobStore.open``) opens
the file a reference names, checks its size, and hands back a
:class:`BlobReader`. Reading it from the first byte to the last hashes it;
at the end the hash must be the reference's, or that read (and every later
one) raises ``CorruptionError``. ``verify()`` hashes the whole file whatever
the position. The reader holds one file descriptor of the store's
``io.FileSystem`` and nothing else, so it stays readable after the store is
closed. It never writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from typing import TYPE_CHECKING, Any

from ..errors import CorruptionError
from ..io import FileSystem
from ..types import BlobRef

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["CHUNK", "BlobMissing", "BlobReader"]

#: Bytes a reader reads and hashes at a time (``readall``, ``verify``).
CHUNK = 1 << 20


class BlobMissing(Exception):
    """The blob file a reference names does not exist (the store decides what that means)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(path)


class BlobReader(io.RawIOBase):
    """A read-only binary stream of one blob, from ``store.open_blob``.

    Reading from the start to the end checks the content: when the last
    byte is read, its SHA-256 must be the reference's, otherwise that read
    raises :class:`~agentwal.errors.CorruptionError` (so does every later
    one). Seeking is allowed; bytes read out of order are not hashed, and
    :meth:`verify` checks the whole file whatever the position. The stream
    stays readable after the store is closed. Use it as a context manager,
    or close it.

    Attributes:
        ref: the :class:`~agentwal.BlobRef` being read.
        name: the blob file's path.

    Example::

        with store.open_blob("run-42", "weights") as f:
            shutil.copyfileobj(f, out)          # CorruptionError if damaged
    """

    def __init__(self, fs: FileSystem, fd: int, path: str, ref: BlobRef, *,
                 verify: bool = True) -> None:
        super().__init__()
        self._fs = fs
        self._fd: int | None = fd
        self.name = path
        self.ref = ref
        self._pos = 0
        self._hasher: Any = hashlib.sha256() if verify else None
        self._hashed = 0  # bytes hashed, in order, from the start
        self._damage: CorruptionError | None = None
        if verify and ref.size == 0:
            self._finish_hash()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        self._check()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` (from the start, the position or the end); returns the position."""
        self._check()
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.ref.size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence!r}")
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1, /) -> bytes:
        """Up to ``size`` bytes (all the rest if ``size`` is negative or None); b"" at the end.

        Raises:
            CorruptionError: the content does not match its reference (at the
                read that reaches the end), or the file cannot be read.
        """
        self._check()
        if size is None or size < 0:
            return self.readall()
        if self._damage is not None:
            raise self._damage
        n = max(0, min(size, self.ref.size - self._pos))
        if n == 0:
            return b""
        fd = self._fd
        assert fd is not None
        try:
            data = self._fs.read(fd, self._pos, n)
        except OSError as exc:
            raise CorruptionError(self.name, self._pos,
                                  f"cannot read the blob file: {exc.strerror or exc}") from None
        if len(data) < n:
            raise self._damaged(f"blob file ends at {self._pos + len(data)} bytes; its "
                                f"reference says {self.ref.size}")
        if self._hasher is not None and self._pos == self._hashed:
            self._hasher.update(data)
            self._hashed += len(data)
            if self._hashed == self.ref.size:
                self._finish_hash()
        self._pos += len(data)
        if self._damage is not None:
            raise self._damage
        return data

    def readall(self) -> bytes:
        """Every byte from the position to the end (the whole blob in memory: mind its size)."""
        parts: list[bytes] = []
        while True:
            chunk = self.read(CHUNK)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        """Read into ``buffer``; returns the number of bytes (0 at the end)."""
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def verify(self) -> None:
        """Hash the whole blob file now (the position does not move).

        Raises:
            CorruptionError: its size or SHA-256 is not the reference's.
        """
        self._check()
        fd = self._fd
        assert fd is not None
        h = hashlib.sha256()
        offset = 0
        while offset < self.ref.size:
            try:
                data = self._fs.read(fd, offset, min(CHUNK, self.ref.size - offset))
            except OSError as exc:
                raise CorruptionError(self.name, offset, "cannot read the blob file: "
                                      f"{exc.strerror or exc}") from None
            if not data:
                raise self._damaged(f"blob file ends at {offset} bytes; its reference says "
                                    f"{self.ref.size}")
            h.update(data)
            offset += len(data)
        if h.hexdigest() != self.ref.sha256:
            raise self._damaged(f"content SHA-256 is {h.hexdigest()}, its reference says "
                                f"{self.ref.sha256}")

    def close(self) -> None:
        """Close the file (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self._fs.close(fd)
        super().close()

    def _check(self) -> None:
        if self._fd is None or self.closed:
            raise ValueError("I/O operation on a closed blob stream")

    def _finish_hash(self) -> None:
        got = self._hasher.hexdigest()
        self._hasher = None
        if got != self.ref.sha256:
            self._damage = self._damaged(f"content SHA-256 is {got}, its reference says "
                                         f"{self.ref.sha256}")

    def _damaged(self, reason: str) -> CorruptionError:
        self._damage = CorruptionError(
            self.name, None, reason,
            "The blob file is damaged; the rest of the store is not affected. Restore "
            "the file from a backup (its name is its SHA-256), or put the artifact again.")
        return self._damage

    def __repr__(self) -> str:
        state = "closed" if self._fd is None else f"at {self._pos}"
        return f"<agentwal.BlobReader {self.ref.sha256[:12]} {self.ref.size} bytes {state}>"
