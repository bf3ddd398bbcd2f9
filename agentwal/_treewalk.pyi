# The C extension agentwal/_treewalk.c (built at install when a compiler is there);
# agentwal/tree_scan.py wraps it and holds its pure-Python twin.

def scan(
    where: int | bytes, skip: tuple[bytes, ...], /
) -> tuple[
    bytes,
    int,
    list[bytes],
    bytes,
    dict[bytes, bytes],
    list[bytes],
    list[tuple[bytes, int, bool]],
]: ...

def walk(
    top: bytes,
    skip: tuple[bytes, ...],
    trusted: dict[bytes, bytes],
    store: bytes | None,
    stop: bytes | None,
    /,
) -> tuple[
    set[bytes],
    dict[
        bytes,
        tuple[
            bytes,
            int,
            list[bytes],
            bytes,
            dict[bytes, bytes],
            list[bytes],
            list[tuple[bytes, int, bool]],
        ],
    ],
]: ...
def digest(data: bytes, /) -> bytes: ...
