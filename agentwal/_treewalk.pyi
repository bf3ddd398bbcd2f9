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
