"""Where logicrank keeps what it derives locally (converted models, the LLM cache)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$LOGICRANK_CACHE``, else ``$XDG_CACHE_HOME/logicrank``, else ``~/.cache/logicrank``. A
    variable set but empty counts as unset, never as the working directory; so does a relative
    ``XDG_CACHE_HOME``, as the XDG specification says."""
    if own := os.environ.get("LOGICRANK_CACHE"):
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "logicrank"
