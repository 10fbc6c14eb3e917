"""MkDocs hooks (mkdocs.yml): links from the pages to files of the
repository outside docs/ (the chart's README, an example, the LICENSE) work
where the pages are read in the repository; the built site has no copy of
those files, so there they become the path in code, not a dead link."""

from __future__ import annotations

import posixpath
import re
from typing import Any

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)#\s]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    here = posixpath.dirname(page.file.src_uri)

    def outside(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if "://" in target or target.startswith("mailto:"):
            return match.group(0)
        resolved = posixpath.normpath(posixpath.join("docs", here, target))
        if resolved.startswith("docs/"):
            return match.group(0)
        shown = f"`{resolved}`"
        return label if label.strip("`") == resolved else f"{label} ({shown})"

    return _LINK.sub(outside, markdown)
