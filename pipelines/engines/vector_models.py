"""Which model made a table's vectors, and whether queries can be encoded into their space.

A table records the model its vectors came from (``logicrank.model``): the encoder the index
job ran, or, for precomputed vectors (``logicrank index --vector-column``), the model the user
named with ``--vector-model`` (``external`` when none). Queries can be encoded for its dense
stages only when logicrank can load that model: a registered name or a local model directory.

Apart from :mod:`logicrank.pipelines.engines.embed` on purpose: a document's vector is keyed by
the code that makes it (embed.py and what it imports), and nothing here changes a vector.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from logicrank.pipelines.engines.embed import MODELS, ModelError, registered_package, resolve_model
from logicrank.schemas.digest import json_digest
from logicrank.schemas.errors import first_line

if TYPE_CHECKING:
    from logicrank.pipelines.engines.store import DocStore


def model_of(recorded: str) -> str:
    """The model of a recorded model id (``<model>[@seq<N>]``, embed.py's ``model_id``)."""
    model, _, window = recorded.rpartition("@seq")
    return model if model and window.isdigit() else recorded


def loadable(recorded: str) -> bool:
    """Whether logicrank can load the model of a recorded model id: a registered name or a local
    model directory, one holding a ``config.json`` or a sentence-transformers ``modules.json``
    (its transformer's config in a module's folder, as older releases saved a model), not
    ``external``, the mark of vectors made elsewhere."""
    model = model_of(recorded)
    # (a directory holding a model, not any directory)
    return model in MODELS or any((Path(model) / name).is_file() for name in ("config.json", "modules.json"))


def require_query_encoder(recorded: str | None, where: str) -> None:
    """Raise :class:`~logicrank.pipelines.engines.embed.ModelError` when a table's vectors came
    from a model logicrank cannot load: no query can be encoded into their space. ``where``: the
    job and the table, for the message."""
    if recorded is not None and not loadable(recorded):
        raise ModelError(f"{where} holds precomputed vectors from {recorded!r}, a model logicrank cannot load, so no query can be "
                         f"encoded for its dense stages; use stages that need no encoder (bm25), or index the vectors with "
                         f"--vector-model naming a registered model ({', '.join(sorted(MODELS))}) or a local model directory.")


def require_query_model(store: DocStore, expected: str, job: str, fix: str = "use the table's model (--model)") -> None:
    """For a job that encodes queries with model ``expected``: the table's vectors must come from a
    model logicrank can load (:func:`require_query_encoder`), and from that one (``require_model``);
    for a local model directory, from its files as they are now (:func:`embedding_code`'s record:
    a fine-tune saved over the directory encodes queries into another space than the table's),
    and for a registered one, from its package's version as it is now."""
    require_query_encoder(store.model_id(), f"{job}: table {store.name!r} in {store.uri!r}")
    store.require_model(expected, job, fix)
    made = model_files_of(store.embedded_by())
    if made is not None and made != (now := model_files_digest(model_of(expected))):
        raise ModelError(f"{job}: table {store.name!r} in {store.uri!r} holds vectors the files of {model_of(expected)!r} made as they were "
                         f"({made}), not as they are now ({now or 'not there'}): the model was saved over (or its package upgraded) "
                         "since; index the table again (`logicrank index` embeds every document with the model as it is), or restore "
                         "the model's files.")


def model_files_digest(name: str) -> str | None:
    """16 hex digits of the content of a local model directory (each file's path and SHA-256,
    a README or hidden file aside): a fine-tune saved over it is another encoder, though its
    path is its id (embed.py's ``model_id``). For a registered model, of the package that ships
    it and its version (an upgrade of the package is another encoder). Each file is read once
    per process and state (size, modification and change times, inode)."""
    if name in MODELS:
        return json_digest(registered_package(name))
    if not Path(name).is_dir():
        return None
    root = Path(name).resolve()
    files = sorted(f for f in root.rglob("*") if f.is_file() and not _unread(f.relative_to(root)))
    return json_digest([(f.relative_to(root).as_posix(), _file_sha(f, *_state(f))) for f in files])


def _unread(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts) or rel.suffix.lower() == ".md"


def _state(f: Path) -> tuple[int, int, int, int]:
    st = f.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns  # (a rewrite in place with its times put back sets the change time)


@functools.cache
def _file_sha(f: Path, size: int, mtime_ns: int, inode: int, ctime_ns: int) -> str:
    from logicrank.pipelines.files import sha256_file

    return sha256_file(f)


def embedding_code(code: str, files: str | None) -> str:
    """The record of what made a table's vectors (``DocStore.embedded_by``): the embedding code's
    digest, and a local model directory's content (:func:`model_files_digest`)
    after a ``+``."""
    return code if files is None else f"{code}+{files}"


def model_files_of(record: str | None) -> str | None:
    """The model directory's content in an :func:`embedding_code` record; None where it holds none."""
    return record.partition("+")[2] or None if record else None


def model_dimension(name: str) -> int:
    """The dimension of the vectors model ``name`` (registered, or a local directory) makes: the
    model is loaded once, on the CPU, to ask it; one that does not load is a :class:`ModelError`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = resolve_model(model_of(name))
    from sentence_transformers import SentenceTransformer

    try:
        return int(SentenceTransformer(path, device="cpu").get_embedding_dimension())
    except Exception as exc:  # noqa: BLE001 - any failure to load is the user's model directory: one line
        raise ModelError(f"model {name!r} ({path}) does not load as a sentence-transformers model: {first_line(exc)}") from None
