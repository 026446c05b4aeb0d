"""The child process of :func:`logicrank.pipelines.engines.store.update_index_apart` and
:func:`~logicrank.pipelines.engines.store.maintain_apart`: ``python -m
logicrank.pipelines.engines.store.apart WHAT URI NAME ARGS`` (WHAT ``bm25``: save the BM25 index of
the version ARGS names; ``maintain``: maintain the table's latest version with ARGS' options)
prints what it did as one JSON line (exit 3 with the error, as JSON, on an OSError).

A fresh interpreter that imports only logicrank: the caller's script is never imported again,
as multiprocessing's spawn does, which re-runs a script that lacks a ``__main__`` guard."""

from __future__ import annotations

import json
import sys
from datetime import timedelta


def main(argv: list[str]) -> int:
    from logicrank.pipelines.engines.store import DocStore, json_value

    what, uri, name, args = argv
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
    print(json.dumps(done, default=json_value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
