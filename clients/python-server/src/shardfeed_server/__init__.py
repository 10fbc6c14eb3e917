"""The shardfeed sidecar binary, installed on PATH by this wheel.

``shardfeed.serve()`` finds it through :func:`binary`; from a shell it is
``shardfeed`` in the environment's ``bin``.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

__all__ = ["binary"]


def binary() -> Path:
    """The installed ``shardfeed`` executable."""
    distribution = metadata.distribution("shardfeed-server")
    for file in distribution.files or ():
        if file.name == "shardfeed" and file.parent.name in ("bin", "scripts"):
            return Path(str(distribution.locate_file(file))).resolve()
    raise FileNotFoundError(
        "the shardfeed-server distribution lists no shardfeed executable"
    )
