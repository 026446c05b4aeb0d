"""The one digest of a JSON-able value: configs, stage caches and input fingerprints use it."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def json_digest(value: Any) -> str:
    """A stable digest of a JSON-able value (keys sorted): 16 hex digits of its SHA-256."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
