"""Where logicrank keeps what it derives locally (converted models, the LLM cache)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$LOGICRANK_CACHE``, else ``$XDG_CACHE_HOME/logicrank``, else ``~/.cache/logicrank``."""
    if "LOGICRANK_CACHE" in os.environ:
        return Path(os.environ["LOGICRANK_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "logicrank"
