"""``agentwal ui``: a local, read-only web viewer of a store (needs the ``ui`` extra).

:func:`create_app` (in :mod:`.server`) builds the ASGI app; the page and its
script and style ship in ``static/``; no build step. See ``docs/ui.md``.
"""

from __future__ import annotations

from .server import create_app

__all__ = ["create_app"]
