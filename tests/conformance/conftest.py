"""A fixture per backend kind (``kinds.KINDS``) for the Protocol-level conformance suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.kinds import KINDS


@pytest.fixture(params=sorted(KINDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    kind = KINDS[request.param]
    b = kind.open_backend(str(tmp_path), **{f: request.getfixturevalue(f) for f in kind.fixtures})
    yield b
    b.close()
