"""Re-running a local test module on PostgreSQL: keep the tests that take ``store``.

``tests/postgres/test_*_pg.py`` import a local module's tests with ``*`` and
give them a PostgreSQL ``store`` fixture; :func:`keep_store_tests` then drops
the tests named as needing the local engine, and those that take no ``store``
(they open local stores of their own and already run in the local module).
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any


def keep_store_tests(namespace: dict[str, Any], local: ModuleType,
                     local_only: set[str]) -> None:
    """Remove from ``namespace`` the ``local_only`` tests and those without a ``store``."""
    assert all(hasattr(local, n) for n in local_only), local_only - set(dir(local))
    for name in local_only:
        namespace.pop(name, None)
    for name, fn in list(namespace.items()):
        if name.startswith("test_") and "store" not in inspect.signature(fn).parameters:
            del namespace[name]
