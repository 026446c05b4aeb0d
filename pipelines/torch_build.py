"""Which torch is installed, known without importing it (torch's import takes seconds): a
build for the CPU alone sees no GPU, so a process on a CPU node that only needs to know where
its work would run (the dense product, the LLM prompt cache's key) does not pay the import."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path


@functools.cache
def cpu_only() -> bool:
    """True where the installed torch is built for the CPU alone (its ``torch/version.py``
    names neither CUDA nor ROCm) or no torch is installed; False where it names one or cannot
    be read (then torch itself must be asked)."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return True
    if spec.origin is None:
        return False
    return _cpu_build(Path(spec.origin).with_name("version.py"))


def _cpu_build(version_file: Path) -> bool:
    spec = importlib.util.spec_from_file_location("_torch_version", version_file)
    if spec is None or spec.loader is None:
        return False
    version = importlib.util.module_from_spec(spec)  # (not registered as torch.version: torch is not imported)
    try:
        spec.loader.exec_module(version)
    except Exception:  # noqa: BLE001 - an unreadable or odd version file: torch is asked instead
        return False
    return all(getattr(version, name, None) is None for name in ("cuda", "hip", "rocm"))
