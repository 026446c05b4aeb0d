"""Which model made a table's vectors, and whether queries can be encoded into their space.

A table records the model its vectors came from (``logicrank.model``): the encoder the index
job ran, or, for precomputed vectors (``logicrank index --vector-column``), the model the user
named with ``--vector-model`` (``external`` when none). Queries can be encoded for its dense
stages only when logicrank can load that model: a registered name or a local model directory.

Apart from :mod:`logicrank.pipelines.engines.embed` on purpose: a document's vector is keyed by
the code that makes it (embed.py and what it imports), and nothing here changes a vector.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from logicrank.pipelines.engines.embed import MODELS, ModelError, resolve_model
from logicrank.schemas.errors import first_line

if TYPE_CHECKING:
    from logicrank.pipelines.engines.store import DocStore


def model_of(recorded: str) -> str:
    """The model of a recorded model id (``<model>[@seq<N>]``, embed.py's ``model_id``)."""
    model, _, window = recorded.rpartition("@seq")
    return model if model and window.isdigit() else recorded


def loadable(recorded: str) -> bool:
    """Whether logicrank can load the model of a recorded model id: a registered name or a local
    model directory, one holding a ``config.json`` (not ``external``, the mark of vectors made
    elsewhere)."""
    model = model_of(recorded)
    return model in MODELS or (Path(model) / "config.json").is_file()  # (a directory holding a model, not any directory)


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
    model logicrank can load (:func:`require_query_encoder`), and from that one (``require_model``)."""
    require_query_encoder(store.model_id(), f"{job}: table {store.name!r} in {store.uri!r}")
    store.require_model(expected, job, fix)


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
