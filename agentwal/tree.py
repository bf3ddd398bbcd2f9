"""Directory trees as content-addressed objects: encoding, path safety, ignore rules.

Theory of operation: a tree stored with ``txn.put_tree`` is a hierarchy of
small immutable *objects* kept in the blob store, each named by its SHA-256
like any blob (git's tree objects are the model):

- a *directory object* lists one directory's entries, sorted by name bytes:
  a regular file (permission bits, the SHA-256 and size of its content's
  blob), a symbolic link (its target, inline) or a subdirectory (the SHA-256
  and size of its directory object);
- the *root object* names the top directory's object and records the file
  count, the byte count and the exclude rules the snapshot used (so a
  restore leaves the same paths alone). A key's value is a blob reference
  to the root object with the media type :data:`~agentwal.format.TREE_MEDIA_TYPE`.

An unchanged subdirectory therefore costs one entry in its parent, and a
one-file change costs that file plus the objects on its path to the root.
Both encodings are canonical CBOR (``docs/format.md``, "Trees"); decoding
re-encodes and compares, so one tree has exactly one encoding and one hash.

Path safety lives here too: every name a decoded object holds is checked
(:func:`check_name`) before any caller can use it, so a forged or damaged
object with ``..``, ``/``, an empty name, NUL, or a name listed twice raises
:class:`~agentwal.errors.UnsafeTreeError` and nothing is written for it.

Ignore rules (:class:`IgnoreRules`) follow gitignore: ``#`` comments, ``!``
negation, a trailing ``/`` for directories only, a ``/`` elsewhere anchoring
the pattern to its base directory, ``*``, ``?``, ``[...]`` and ``**``; the
last rule that matches decides. This module does no I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import cbor2

from .codec import CodecError, loads
from .errors import UnsafeTreeError
from .format import (
    TREE_DIR,
    TREE_FILE,
    TREE_LINK,
    TREE_MAGIC,
    TREE_ROOT_MAGIC,
    TREE_VERSION,
)
from .types import TreeDiff

__all__ = [
    "GITIGNORE",
    "Entry",
    "IgnoreRules",
    "Root",
    "check_name",
    "decode_dir",
    "decode_root",
    "diff_listings",
    "encode_dir",
    "encode_root",
    "object_hash",
    "split_relpath",
]

#: Permission bits a file entry may carry.
PERM_MASK = 0o777


class _GitIgnore:
    """The marker ``agentwal.GITIGNORE``: honour ``.gitignore`` files (and skip ``.git``)."""

    _instance: _GitIgnore | None = None

    def __new__(cls) -> _GitIgnore:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "agentwal.GITIGNORE"

    def __reduce__(self) -> str:
        return "GITIGNORE"


#: Pass as ``exclude`` (alone, or in a list with patterns) to honour the tree's
#: ``.gitignore`` files, as git does; ``.git`` itself is then skipped too.
GITIGNORE = _GitIgnore()


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a directory object.

    Attributes:
        name: the name, as bytes (``os.fsencode`` of the file name).
        kind: ``TREE_FILE``, ``TREE_LINK`` or ``TREE_DIR``.
        perm: a file's permission bits (0 for the other kinds).
        sha256: a file's content hash, or a directory's object hash (hex);
            "" for a link.
        size: a file's length, a directory object's length, or a link
            target's length.
        target: a link's target (bytes), else b"".
    """

    name: bytes
    kind: int
    perm: int = 0
    sha256: str = ""
    size: int = 0
    target: bytes = b""

    def encoded(self) -> list[Any]:
        if self.kind == TREE_FILE:
            return [self.name, TREE_FILE, self.perm, bytes.fromhex(self.sha256), self.size]
        if self.kind == TREE_DIR:
            return [self.name, TREE_DIR, bytes.fromhex(self.sha256), self.size]
        return [self.name, TREE_LINK, self.target]


@dataclass(frozen=True, slots=True)
class Root:
    """The root object of a stored tree.

    Attributes:
        sha256, size: the top directory's object.
        files: regular files and links in the tree.
        bytes: the files' total size.
        exclude: the exclude patterns the snapshot used (gitignore syntax).
        gitignore: whether ``.gitignore`` files were honoured.
    """

    sha256: str
    size: int
    files: int
    bytes: int
    exclude: tuple[str, ...] = ()
    gitignore: bool = False


def object_hash(data: bytes) -> str:
    """The hex SHA-256 that names an object (as the blob store names any blob)."""
    return hashlib.sha256(data).hexdigest()


# -- names and paths -------------------------------------------------------------------


def check_name(name: object, where: str = "") -> bytes:
    """Return ``name`` if it is a safe entry name, else raise :class:`UnsafeTreeError`.

    A safe name is non-empty bytes, not ``.`` nor ``..``, with no ``/`` and no NUL.
    """
    label = (where + "/" if where else "") + (
        name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else repr(name))
    if not isinstance(name, bytes):
        raise UnsafeTreeError(label, f"a name must be bytes, not {type(name).__name__}")
    if not name:
        raise UnsafeTreeError(label, "an empty name")
    if name in (b".", b".."):
        raise UnsafeTreeError(label, f"the name {name.decode()!r} would leave its directory")
    if b"/" in name:
        raise UnsafeTreeError(label, "a name holding '/' (an absolute or nested path)")
    if b"\0" in name:
        raise UnsafeTreeError(label, "a name holding NUL")
    return name


def split_relpath(relpath: str) -> list[str]:
    """The names of a ``/``-separated path inside a tree; ValueError if it could escape it.

    ``.`` and empty components are skipped (``"./a//b"`` is ``a/b``); an
    absolute path, a ``..`` or a NUL is refused.
    """
    if not isinstance(relpath, str):
        raise ValueError(f"a path must be str, not {type(relpath).__name__}")
    if relpath.startswith("/"):
        raise ValueError("an absolute path")
    if "\0" in relpath:
        raise ValueError("a path holding NUL")
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError("a path holding '..'")
    if not parts:
        raise ValueError("an empty path")
    return parts


# -- directory and root objects --------------------------------------------------------


def encode_dir(entries: Iterable[Entry]) -> bytes:
    """The canonical directory object of ``entries`` (sorted here by name bytes)."""
    ordered = sorted(entries, key=lambda e: e.name)
    return bytes(cbor2.dumps([TREE_MAGIC, TREE_VERSION, [e.encoded() for e in ordered]]))


def _hex32(value: object, label: str) -> str:
    if not isinstance(value, bytes) or len(value) != 32:
        raise CodecError(f"{label}: a hash must be 32 bytes")
    return value.hex()


def _uint(value: object, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CodecError(f"{label}: a size must be an unsigned integer")
    return value


def _entry(item: object, where: str) -> Entry:
    if not isinstance(item, list) or len(item) < 3:
        raise CodecError(f"{where or '/'}: a malformed entry")
    name = check_name(item[0], where)
    label = (where + "/" if where else "") + name.decode("utf-8", "backslashreplace")
    kind = item[1]
    if kind == TREE_FILE and len(item) == 5:
        perm = _uint(item[2], label)
        if perm & ~PERM_MASK:
            raise CodecError(f"{label}: permission bits {perm:o} beyond 0777")
        return Entry(name, TREE_FILE, perm, _hex32(item[3], label), _uint(item[4], label))
    if kind == TREE_DIR and len(item) == 4:
        return Entry(name, TREE_DIR, 0, _hex32(item[2], label), _uint(item[3], label))
    if kind == TREE_LINK and len(item) == 3:
        target = item[2]
        if not isinstance(target, bytes) or not target or b"\0" in target:
            raise UnsafeTreeError(label, "a link target must be non-empty bytes without NUL")
        return Entry(name, TREE_LINK, 0, "", len(target), target)
    raise CodecError(f"{label}: an entry of unknown kind {kind!r}")


def decode_dir(data: bytes, where: str = "") -> list[Entry]:
    """The entries of a directory object, checked, in name order.

    Args:
        data: the object's bytes.
        where: its path in the tree ("" for the top), for messages.

    Raises:
        UnsafeTreeError: an unsafe or repeated name.
        CodecError: anything else malformed, or a non-canonical encoding.
    """
    obj = loads(data)
    if (not isinstance(obj, list) or len(obj) != 3 or obj[0] != TREE_MAGIC
            or not isinstance(obj[2], list)):
        raise CodecError(f"{where or '/'}: not a directory object")
    if obj[1] != TREE_VERSION:
        raise CodecError(f"{where or '/'}: directory object version {obj[1]!r} is not "
                         f"{TREE_VERSION}")
    entries = [_entry(item, where) for item in obj[2]]
    for a, b in itertools.pairwise(entries):
        if a.name >= b.name:
            label = (where + "/" if where else "") + b.name.decode("utf-8", "backslashreplace")
            if a.name == b.name:
                raise UnsafeTreeError(label, "a name listed twice in one directory")
            raise CodecError(f"{label}: entries out of order")
    if encode_dir(entries) != data:
        raise CodecError(f"{where or '/'}: a directory object not in its canonical encoding")
    return entries


def encode_root(root: Root) -> bytes:
    """The canonical root object of ``root``."""
    return bytes(cbor2.dumps([TREE_ROOT_MAGIC, TREE_VERSION, bytes.fromhex(root.sha256),
                              root.size, root.files, root.bytes, list(root.exclude),
                              root.gitignore]))


def decode_root(data: bytes) -> Root:
    """Decode a root object, exactly as :func:`encode_root` writes it.

    Raises:
        CodecError: not a root object, or not in its canonical encoding.
    """
    obj = loads(data)
    if (not isinstance(obj, list) or len(obj) != 8 or obj[0] != TREE_ROOT_MAGIC
            or obj[1] != TREE_VERSION or not isinstance(obj[6], list)
            or not all(isinstance(p, str) for p in obj[6]) or not isinstance(obj[7], bool)):
        raise CodecError("not a tree root object")
    root = Root(_hex32(obj[2], "root"), _uint(obj[3], "root"), _uint(obj[4], "root"),
                _uint(obj[5], "root"), tuple(obj[6]), obj[7])
    if encode_root(root) != data:
        raise CodecError("a root object not in its canonical encoding")
    return root


# -- ignore rules ----------------------------------------------------------------------


def _translate(pattern: str) -> str:
    """A regular expression for one gitignore glob (already stripped of ``!`` and ``/``)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif c == "[":
            j = i + 1
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal '['
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1:j]
            neg = body[:1] in ("!", "^")
            if neg:
                body = body[1:]
            body = body.replace("\\", "\\\\")
            out.append("(?!/)[" + ("^" if neg else "") + body + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Rule:
    base: str  # directory the rule is relative to ("" for the top)
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _parse(line: str, base: str) -> _Rule | None:
    line = line.rstrip("\n").rstrip("\r")
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(line) > len(stripped):
        stripped += " "  # an escaped trailing space stays
    line = stripped
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate or line.startswith(("\\!", "\\#")):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    body = _translate(line)
    return _Rule(base, re.compile(("" if anchored else "(?:.*/)?") + body, re.DOTALL),
                 negate, dir_only)


class IgnoreRules:
    """An ordered, immutable list of gitignore rules; :meth:`ignored` applies them.

    Example::

        rules = IgnoreRules.of(["*.pyc", "build/", "!keep.pyc"])
        rules.ignored("src/a.pyc", is_dir=False)     # True
    """

    __slots__ = ("_rules",)

    def __init__(self, rules: tuple[_Rule, ...] = ()) -> None:
        self._rules = rules

    @classmethod
    def of(cls, patterns: Iterable[str], base: str = "") -> IgnoreRules:
        """Rules from ``patterns`` (lines of gitignore syntax), relative to ``base``."""
        return cls().extended(patterns, base)

    def extended(self, lines: Iterable[str], base: str) -> IgnoreRules:
        """These rules followed by ``lines`` (a ``.gitignore`` in directory ``base``)."""
        more = tuple(r for r in (_parse(line, base) for line in lines) if r is not None)
        return IgnoreRules(self._rules + more) if more else self

    def ignored(self, relpath: str, is_dir: bool) -> bool:
        """Whether ``relpath`` (``/``-separated, from the top) is excluded."""
        verdict = False
        for rule in self._rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.base:
                if not relpath.startswith(rule.base + "/"):
                    continue
                sub = relpath[len(rule.base) + 1:]
            else:
                sub = relpath
            if rule.regex.fullmatch(sub):
                verdict = not rule.negate
        return verdict

    def __bool__(self) -> bool:
        return bool(self._rules)


def exclude_spec(exclude: object) -> tuple[tuple[str, ...], bool]:
    """``(patterns, gitignore)`` from put_tree's ``exclude`` argument.

    Accepts None, one pattern (a str), :data:`GITIGNORE`, or an iterable of
    patterns that may hold :data:`GITIGNORE`.

    Raises:
        TypeError: anything else.
    """
    if exclude is None:
        return (), False
    if exclude is GITIGNORE:
        return (), True
    if isinstance(exclude, str):
        return (exclude,), False
    if isinstance(exclude, (bytes, Mapping)) or not isinstance(exclude, Iterable):
        raise TypeError("exclude must be None, a pattern (str), agentwal.GITIGNORE, or a list "
                        f"of those, not {type(exclude).__name__}")
    patterns: list[str] = []
    gitignore = False
    for item in exclude:
        if item is GITIGNORE:
            gitignore = True
        elif isinstance(item, str):
            patterns.append(item)
        else:
            raise TypeError(f"an exclude pattern must be str, not {type(item).__name__}")
    return tuple(patterns), gitignore


# -- listings and diffs ----------------------------------------------------------------

#: What a flattened tree maps each path to: (kind, perm, sha256 or target, size).
Leaf = tuple[int, int, str, int]


def leaf(entry: Entry) -> Leaf:
    """The comparable summary of a file or link entry."""
    if entry.kind == TREE_LINK:
        return (TREE_LINK, 0, entry.target.hex(), entry.size)
    return (TREE_FILE, entry.perm, entry.sha256, entry.size)


def diff_listings(old: Mapping[str, Leaf], new: Mapping[str, Leaf]) -> TreeDiff:
    """The file-level change from listing ``old`` to listing ``new`` (paths sorted)."""
    added = {p: new[p][3] for p in sorted(new.keys() - old.keys())}
    removed = {p: old[p][3] for p in sorted(old.keys() - new.keys())}
    modified = {p: (old[p][3], new[p][3]) for p in sorted(old.keys() & new.keys())
                if old[p] != new[p]}
    return TreeDiff(added, removed, modified)


def join(where: str, name: bytes | str) -> str:
    """``where/name`` with ``name`` as text (``os.fsdecode`` rules: surrogateescape)."""
    text = name if isinstance(name, str) else name.decode("utf-8", "surrogateescape")
    return f"{where}/{text}" if where else text


def walk_entries(entries: Mapping[str, list[Entry]], top: str) -> Iterator[tuple[str, Entry]]:
    """``(path, entry)`` for every file and link below directory object ``top``.

    Args:
        entries: decoded directory objects by hash (every one reachable).
        top: the hash of the directory to start from.
    """
    stack: list[tuple[str, str]] = [("", top)]
    while stack:
        where, sha = stack.pop()
        for e in entries[sha]:
            path = join(where, e.name)
            if e.kind == TREE_DIR:
                stack.append((path, e.sha256))
            else:
                yield path, e
