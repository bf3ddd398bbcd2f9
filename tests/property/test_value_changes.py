"""views.value_changes: the changes it lists turn the old value into the new one."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from agentwal.views import value_changes

SCALARS = st.integers(min_value=-3, max_value=3)


def _apply_list(old: list[Any], changes: list[dict[str, Any]]) -> list[Any]:
    out = list(old)
    for c in changes:
        index = re.fullmatch(r"\[(\d+)\]", c["path"])
        if index:
            assert c["op"] == "changed"
            out[int(index.group(1))] = c["new"]
        elif c["op"] == "removed_items":
            del out[c["at"]:c["at"] + len(c["items"])]
        else:
            assert c["op"] in ("appended", "inserted_items") and c["path"] == ""
            out[c["at"]:c["at"]] = c["items"]
    return out


@given(st.lists(SCALARS, max_size=12), st.lists(SCALARS, max_size=12))
def test_list_changes_rebuild_the_new_list(old: list[int], new: list[int]) -> None:
    changes = list(value_changes(old, new))
    assert _apply_list(old, changes) == new
    assert (changes == []) == (old == new)
    assert all(c.get("old") != c.get("new") for c in changes if c["op"] == "changed")


@given(st.lists(SCALARS, max_size=12), st.lists(SCALARS, min_size=1, max_size=5))
def test_a_list_that_grew_is_one_append_of_the_new_items(old: list[int],
                                                         extra: list[int]) -> None:
    assert list(value_changes(old, old + extra)) == [
        {"op": "appended", "path": "", "at": len(old), "items": extra}]


@given(st.dictionaries(st.sampled_from("abcde"), SCALARS),
       st.dictionaries(st.sampled_from("abcde"), SCALARS))
def test_dict_changes_name_each_key(old: dict[str, int], new: dict[str, int]) -> None:
    out = dict(old)
    for c in value_changes(old, new):
        key = c["path"].removeprefix(".")
        if c["op"] == "removed":
            del out[key]
        else:
            assert c["op"] in ("added", "changed")
            out[key] = c["new"]
    assert out == new


@example("", "\n")  # text from nothing is the new value whole, never a line diff
@given(st.text(max_size=20), st.text(min_size=1, max_size=20))
def test_text_that_grew_is_the_appended_text(old: str, extra: str) -> None:
    changes = list(value_changes(old, old + extra))
    if old:
        assert changes == [{"op": "appended", "path": "", "at": len(old), "new": extra}]
    else:
        assert changes == [{"op": "changed", "path": "", "old": "", "new": extra}]
