"""Where logicrank keeps what it derives locally (converted models, the LLM cache)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$LOGICRANK_CACHE``, else ``$XDG_CACHE_HOME/logicrank``, else ``~/.cache/logicrank``. A
    variable set but empty counts as unset (the XDG rule), never as the working directory."""
    if own := os.environ.get("LOGICRANK_CACHE"):
        return Path(own)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "logicrank"
