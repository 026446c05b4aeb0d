"""numba and vLLM in one process.

At engine start vLLM (``vllm/triton_utils/dispatcher.py``) reads ``vars(value)`` of every
attribute of every loaded module. llvmlite's library handle (``llvmlite.binding.ffi.lib``,
loaded with numba) answers any attribute, ``__dict__`` included, with a function wrapper, so
that scan raises and no engine starts in a process that has loaded numba (seen with vLLM 0.32
and llvmlite 0.47). :func:`make_llvmlite_scannable` puts the handle behind a forwarding object
with a real ``__dict__``; llvmlite calls through it unchanged. The BM25 engine calls it when it
loads numba, the LLM engine before it starts vLLM (numba loaded by anything else).
"""

from __future__ import annotations

import sys


class _ScannableLib:
    """Forwards every attribute to llvmlite's library handle, and has a ``__dict__`` of its own."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        if name == "_lib":  # not set yet (a copy being made): no forwarding to itself
            raise AttributeError(name)
        return getattr(self._lib, name)


def make_llvmlite_scannable() -> None:
    """Wrap llvmlite's library handle if llvmlite is loaded and the handle is not scannable."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is None or isinstance(ffi.lib, _ScannableLib) or isinstance(getattr(ffi.lib, "__dict__", None), dict):
        return
    ffi.lib = _ScannableLib(ffi.lib)
