# The C extension agentwal/_treewalk.c (built at install when a compiler is there);
# agentwal/tree_scan.py wraps it and holds its pure-Python twin.

# scan's listing: tree_scan.Listing's fields (sigs, newest, names, stats, targets, dirs,
# errors)
_Listing = tuple[
    bytes, int, list[bytes], bytes, dict[bytes, bytes], list[bytes],
    list[tuple[bytes, int, bool]],
]

def scan(where: int | bytes, skip: tuple[bytes, ...], /) -> _Listing: ...
def walk(
    top: bytes,
    skip: tuple[bytes, ...],
    trusted: dict[bytes, bytes],
    store: bytes | None,
    stop: bytes | None,
    /,
) -> tuple[set[bytes], dict[bytes, _Listing]]: ...
def digest(data: bytes, /) -> bytes: ...
