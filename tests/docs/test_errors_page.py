"""docs/errors.md's summary table is agentwal.errors: every error class with its ``code``, and
the classes it is "also a" (its direct bases but the roots), no more and no fewer."""

from __future__ import annotations

import re

import agentwal.errors as errors
from tests.docs.blocks import ROOT

ROW = re.compile(r"^\| `(\w+)` \| `(\w+)` \| ([^|]*)\|", re.M)


def _summary() -> dict[str, tuple[str, set[str]]]:
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    table = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    return {name: (code, set(re.findall(r"`(\w+)`", also)))
            for name, code, also in ROW.findall(table)}


def test_the_summary_lists_every_error_with_its_code_and_its_other_bases() -> None:
    classes = {n: v for n, v in vars(errors).items()
               if isinstance(v, type) and issubclass(v, errors.Error)}
    doc = _summary()
    assert sorted(doc) == sorted(classes)
    for name, cls in classes.items():
        code, also = doc[name]
        assert code == cls.code, name
        # "also a": its direct bases but the roots (Error, and EffectError for its family)
        roots = {"Error", "EffectError", "Exception"}
        assert also == {b.__name__ for b in cls.__bases__} - roots, name
