"""The child process of :func:`logicrank.pipelines.engines.store.update_index_apart`: ``python -m
logicrank.pipelines.engines.store.apart URI NAME VERSION`` saves the BM25 index of that version of the
table and prints what it did as one JSON line (exit 3 with the error, as JSON, on an OSError).

A fresh interpreter that imports only logicrank: the caller's script is never imported again,
as multiprocessing's spawn does, which re-runs a script that lacks a ``__main__`` guard."""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from logicrank.pipelines.engines.bm25 import update_index
    from logicrank.pipelines.engines.store import DocStore, json_value

    uri, name, version = argv
    try:
        done = update_index(DocStore(uri, name, version=int(version)))
    except OSError as exc:  # (a full disk, say): the parent says so in the manifest
        print(json.dumps({"oserror": [exc.errno, exc.strerror or str(exc), exc.filename]}))
        return 3
    print(json.dumps(done, default=json_value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
