"""The child process of :func:`logicrank.pipelines.engines.store.update_index_apart` and
:func:`~logicrank.pipelines.engines.store.maintain_apart`: ``python -m
logicrank.pipelines.engines.store.apart WHAT URI NAME ARGS PARENT`` (WHAT ``bm25``: save the BM25
index of the version ARGS names; ``maintain``: maintain the table's latest version with ARGS'
options; PARENT: the caller's process id) prints what it did as one JSON line (exit 3 with the
error, as JSON, on an OSError; exit 4 with the message on a user error).

A fresh interpreter that imports only logicrank: the caller's script is never imported again,
as multiprocessing's spawn does, which re-runs a script that lacks a ``__main__`` guard. It
ends when its caller ends, however that ends (:func:`die_with_parent`): it writes under the
caller's table lock, which goes with the caller, and must not go on writing without it."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from datetime import timedelta


def die_with_parent(parent: int, every_s: float = 0.5) -> None:
    """End this process (SIGKILL) when process ``parent`` ends: at once on Linux (the kernel's
    parent-death signal), else within ``every_s`` (a thread watching the parent's id); at once
    if it has already ended."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: watch instead
        def watch():
            while os.getppid() == parent:
                threading.Event().wait(every_s)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True, name="die-with-parent").start()
    if os.getppid() != parent:  # it ended before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    what, uri, name, args, parent = argv
    die_with_parent(int(parent))
    from logicrank.pipelines.engines.store import DocStore, json_value
    from logicrank.schemas.errors import UserError

    args = json.loads(args)
    try:
        if what == "bm25":
            from logicrank.pipelines.engines.bm25 import update_index

            done = update_index(DocStore(uri, name, version=int(args["version"])))
        elif what == "maintain":
            done = DocStore(uri, name).maintain(args["ann_threshold"], timedelta(seconds=args["prune_seconds"]), args["changed"],
                                                args["rebuild"])
        else:
            raise SystemExit(f"apart: unknown step {what!r} (bm25 or maintain)")
    except OSError as exc:  # (a full disk, say): the parent says so in the manifest
        print(json.dumps({"oserror": [exc.errno, exc.strerror or str(exc), exc.filename]}))
        return 3
    except UserError as exc:  # (the table gone, say): the parent raises it as the store's one line
        print(json.dumps({"usererror": str(exc)}))
        return 4
    print(json.dumps(done, default=json_value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
