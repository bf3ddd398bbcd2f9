"""docs/api.md's field tables list every field of the dataclasses they describe, and no other.

A row whose type says "(property)" names a property of the class instead; properties that
the table leaves out are documented in the prose under it, so only listed ones are checked.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

import agentwal
from tests.docs.blocks import ROOT

API = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def _field_tables() -> dict[str, set[str]]:
    """`### Name` sections holding a `| Field |` table: the names in that table's first column."""
    tables = {}
    for section in re.split(r"^### ", API, flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        lines = body.splitlines()
        header = next((i for i, line in enumerate(lines) if line.startswith("| Field |")), None)
        if header is None:
            continue
        rows = []
        for line in lines[header + 2:]:  # the first table after the title, to its end
            if not line.startswith("|"):
                break
            rows.append(line)
        names = set()
        for row in rows:
            cells = row.split("|")
            found = set(re.findall(r"`(\w+)`", cells[1]))
            names.update(f"{n} (property)" if "(property)" in cells[2] else n for n in found)
        tables[title.strip()] = names
    return tables


TABLES = {name: names for name, names in _field_tables().items()
          if dataclasses.is_dataclass(getattr(agentwal, name, None))}


def test_the_records_api_md_describes_have_field_tables() -> None:
    assert "EffectRecord" in TABLES


@pytest.mark.parametrize("name", sorted(TABLES))
def test_field_table_matches_the_dataclass(name: str) -> None:
    cls = getattr(agentwal, name)
    fields = {f.name for f in dataclasses.fields(cls)}
    fields |= {f"{n} (property)" for n, v in vars(cls).items() if isinstance(v, property)}
    listed = TABLES[name]
    fields -= {f for f in fields if f.endswith("(property)") and f not in listed}
    assert listed == fields, (f"docs/api.md ### {name}: missing {fields - listed}, "
                              f"not a field {listed - fields}")
