"""agentwal on PostgreSQL: many workers on many hosts share runs, one writer per run.

``open_postgres(dsn, ...)`` (and ``agentwal.open("postgresql://...")``) returns a
:class:`PostgresStore`. The modules: ``schema`` (tables and migrations), ``db``
(sessions, error translation), ``leases`` (acquire, renew, claim, fencing
tokens), ``backend`` (views, fenced commits, history, the effects ledger) and
``store`` (the public API). Importing this package needs the ``postgres``
extra (``pip install 'agentwal[postgres]'``); importing ``agentwal`` does not.
"""

from .store import PostgresStore, open_postgres

__all__ = ["PostgresStore", "open_postgres"]
