"""Datasets by name: the bundled ones, the ones a user registers, and ir_datasets' (``irds:<id>``).

- **Bundled** (:data:`BUNDLED`): sets that ship inside the package.
- **Registered**: a user's collections, by name, in a YAML file (``$LOGICRANK_DATASETS``,
  default ``~/.config/logicrank/datasets.yaml``): each a corpus, a queries file and a qrels
  file in any format ``logicrank index``, ``retrieve`` and ``evaluate`` read (BEIR, JSONL,
  Parquet, TREC SGML and topics, TSV). ``logicrank datasets add`` writes an entry;
  ``logicrank datasets`` lists every name.
- **ir_datasets**: ``irds:<id>`` reads a dataset through ir_datasets from the user's local
  ir_datasets cache (``$IR_DATASETS_HOME``, default ``~/.ir_datasets``) and writes it as a
  BEIR directory; nothing is downloaded (a dataset not in the cache is one line saying so).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from logicrank.pipelines.files import read_yaml, write_text_atomic
from logicrank.schemas.errors import UserError, validation_line

REGISTRY_ENV = "LOGICRANK_DATASETS"
IRDS = "irds:"

# name -> (what it is, the experiment dataset fields it stands for)
BUNDLED = {
    "scifact": ("BEIR SciFact test: 5,183 abstracts, 300 queries (retrieval)", {"bundled": "scifact"}),
    "musique": ("100 MuSiQue-Ans questions with their paragraphs (multi-hop QA)", {"qa": "musique"}),
    "hotpotqa": ("100 HotpotQA dev-distractor questions (multi-hop QA)", {"qa": "hotpotqa"}),
    "limit-small": ("LIMIT-small: set-logic queries generated with exact gold", {"setlogic": {}}),
    "synthetic": ("ITLR's synthetic logical benchmark over SciFact text, generated", {"synthetic": {}}),
}


class DatasetError(UserError, ValueError):
    """A dataset name that names nothing, or a registry that cannot be read or written."""


class Registered(BaseModel):
    """A user's collection: three files in any format the jobs read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    corpus: str = Field(description="The corpus: a file or directory (BEIR, JSONL, Parquet, TREC SGML, TSV).")
    queries: str = Field(description="The queries: BEIR queries.jsonl, JSONL, Parquet, TSV or a TREC topics file.")
    qrels: str = Field(description="The qrels: BEIR TSV or TREC qrels.")
    format: Literal["auto", "beir", "jsonl", "parquet", "trec", "tsv"] = Field(
        "auto", description="The corpus format (auto: each file's kind from its name).")
    topics_field: Literal["title", "desc", "narr"] = Field("title", description="A TREC topics file's field that is the query.")
    description: str = ""


def registry_path() -> Path:
    return Path(os.environ.get(REGISTRY_ENV) or Path.home() / ".config" / "logicrank" / "datasets.yaml")


def registered() -> dict[str, Registered]:
    """The user's registered datasets (none when the registry file does not exist)."""
    path = registry_path()
    if not path.is_file():
        return {}
    data = read_yaml(path, "dataset registry", DatasetError) or {}
    if not isinstance(data, dict):
        raise DatasetError(f"dataset registry {path}: a mapping of names to {{corpus, queries, qrels}}, not {type(data).__name__}")
    out = {}
    for name, entry in data.items():
        try:
            out[str(name)] = Registered.model_validate(entry)
        except ValidationError as exc:
            raise DatasetError(validation_line(exc, f"dataset registry {path}: {name}")) from None
    return out


def register(name: str, entry: Registered, replace: bool = False) -> Path:
    """Add ``name`` to the registry (its paths made absolute); an existing name needs ``replace``."""
    import yaml

    check_name(name)
    held = registered()
    if name in held and not replace:
        raise DatasetError(f"dataset {name!r} is already registered ({registry_path()}); pass --replace to overwrite it")
    absolute = entry.model_copy(update={k: str(Path(os.path.expandvars(getattr(entry, k))).expanduser().resolve())
                                        for k in ("corpus", "queries", "qrels")})
    missing = [f"{k} {getattr(absolute, k)}" for k in ("corpus", "queries", "qrels") if not Path(getattr(absolute, k)).exists()]
    if missing:
        raise DatasetError(f"dataset {name!r}: no such path: {'; '.join(missing)}")
    held[name] = absolute
    path = registry_path()
    write_text_atomic(yaml.safe_dump({k: v.model_dump(exclude_defaults=True) for k, v in held.items()}, sort_keys=True), path)
    return path


def unregister(name: str) -> Path:
    import yaml

    held = registered()
    if name not in held:
        raise DatasetError(f"dataset {name!r} is not registered; registered: {', '.join(held) or 'none'}")
    del held[name]
    path = registry_path()
    write_text_atomic(yaml.safe_dump({k: v.model_dump(exclude_defaults=True) for k, v in held.items()}, sort_keys=True), path)
    return path


def check_name(name: str) -> None:
    if not name or name.startswith(IRDS) or name in BUNDLED or any(c.isspace() for c in name):
        raise DatasetError(f"dataset name {name!r}: give a new name without spaces (not a bundled name: {', '.join(BUNDLED)}; "
                           f"not {IRDS}...)")


def names() -> list[str]:
    """Every name a dataset can be given by: bundled, then registered."""
    return [*BUNDLED, *registered()]


@contextlib.contextmanager
def _no_downloads() -> Iterator[None]:
    """ir_datasets reads only what its cache holds: any download it starts fails at once."""
    from unittest import mock

    from ir_datasets.util import download

    def refuse(self, *args, **kwargs):
        raise DatasetError("not in the local ir_datasets cache, and nothing is downloaded here")

    with contextlib.ExitStack() as stack:
        for cls in (download.RequestsDownload, download.GoogleDriveDownload, download.GoogleCloudBucketStream):
            stack.enter_context(mock.patch.object(cls, "stream", refuse))
        yield


def irds_to_beir(dataset_id: str, out: Path) -> Path:
    """ir_datasets' ``dataset_id`` written as a BEIR directory under ``out`` (corpus.jsonl,
    queries.jsonl, qrels/test.tsv), once: a directory that this conversion (the dataset, this
    module's code, ir_datasets' version: :func:`_conversion`) completed is reused."""
    import ir_datasets

    done, made_by = out / ".complete", _conversion(dataset_id)
    if done.is_file() and done.read_text(encoding="utf-8") == made_by:
        return out
    done.unlink(missing_ok=True)  # the files are about to change: no earlier conversion is complete meanwhile
    home = os.environ.get("IR_DATASETS_HOME", str(Path.home() / ".ir_datasets"))
    where = f"{IRDS}{dataset_id}"
    try:
        with _no_downloads():
            ds = ir_datasets.load(dataset_id)
            lacks = [what for what, has in (("documents", ds.has_docs()), ("queries", ds.has_queries()), ("qrels", ds.has_qrels())) if not has]
            if lacks:
                raise DatasetError(f"{where}: has no {', '.join(lacks)}; an experiment needs documents, queries and qrels")
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
                for doc in ds.docs_iter():
                    title, text = doc_fields(doc)
                    f.write(json.dumps({"_id": doc.doc_id, "title": title, "text": text}) + "\n")
            with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
                for q in ds.queries_iter():
                    f.write(json.dumps({"_id": q.query_id, "text": _query_text(q)}) + "\n")
            (out / "qrels").mkdir(exist_ok=True)
            with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                for r in ds.qrels_iter():
                    f.write(f"{r.query_id}\t{r.doc_id}\t{int(r.relevance)}\n")
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}" if not str(exc).startswith(where) else str(exc)) from None
    except KeyError:
        raise DatasetError(f"{where}: ir_datasets knows no dataset {dataset_id!r} (`ir_datasets list` names them)") from None
    except Exception as exc:  # noqa: BLE001 - any failure inside ir_datasets is the dataset's, said in one line
        raise DatasetError(f"{where}: ir_datasets could not read it from its cache {home} ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    write_text_atomic(made_by, done)
    return out


def _conversion(dataset_id: str) -> str:
    """What a converted directory is the output of: the dataset, the code that converts it (this
    module's, :func:`~logicrank.pipelines.codedigest.code_digest`) and the version of
    ir_datasets that reads it. A change of either converts again."""
    from importlib.metadata import version

    from logicrank.pipelines.codedigest import code_digest

    return json.dumps({"dataset": dataset_id, "code": code_digest(__name__), "ir_datasets": version("ir_datasets")}, sort_keys=True)


def doc_fields(doc) -> tuple[str, str]:
    """A document's (title, text): its ``title`` and ``text`` fields, else ir_datasets' default
    text, which for a document without a ``text`` field (MS MARCO documents, TREC's parsed
    documents, NFCorpus, WaPo) starts with the title: the title is taken off it, so the title
    and body embedded and indexed hold the title once, as for a BEIR corpus."""
    title = getattr(doc, "title", "") or ""
    text = getattr(doc, "text", None)
    if isinstance(text, str):
        return title, text
    text = doc.default_text()
    if title and text.startswith(title):
        return title, text[len(title):].lstrip()
    return ("", text) if title and title in text else (title, text)


def _query_text(query) -> str:
    """A query's text: ir_datasets' default text (a TREC topic's title), else its ``text`` field."""
    return query.default_text() if hasattr(query, "default_text") else getattr(query, "text", "") or ""
