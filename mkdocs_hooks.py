"""mkdocs hooks: README.md is the site's landing page, and links out of docs/ become paths.

README.md lives at the repository root, where GitHub shows it, and links to `docs/x.md`;
the site serves it as `index.md` with those links pointing at the pages. A link from a page
to a file outside docs/ (an example, a test) cannot be a page of the site: it is written as
the file's path in the repository instead, so the strict build has no broken link.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.abspath(__file__))
LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)]*)?\)")


def on_files(files: Files, config: Any) -> Files:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    # docs/x.md is page x.md; any other relative link leaves docs/
    readme = re.sub(r"\]\((?!\w+://|#)(docs/)?", lambda m: "](" if m[1] else "](../", readme)
    files.append(File.generated(config, "index.md", content=readme))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    page_dir = posixpath.dirname(page.file.src_uri)

    def outside(m: re.Match[str]) -> str:
        target = m["target"]
        if "://" in target or target.startswith("mailto:"):
            return m[0]
        path = posixpath.normpath(posixpath.join(page_dir, target))
        if not path.startswith("../"):
            return m[0]
        repo_path = path[3:]
        text = m["text"]
        return text if repo_path in text else f"{text} (`{repo_path}` in the repository)"

    return LINK.sub(outside, markdown)
