"""An experiment's dataset made ready to run: a bundled set, a BEIR directory, a converter's
output (RuleBench, QA sets, ir_datasets) or a generator's (set-logic, ITLR's synthetic
benchmark), or three files in any format the jobs read; then drawn down to a sample or to
named queries (:func:`sample_queries`). Paths may hold environment variables (:func:`expand`)."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.evaluation.experiment.model import Dataset, ExperimentError
from logicrank.pipelines.files import open_text, read_jsonl, write_text_atomic
from logicrank.pipelines.io import QUERY_ID_KEYS, jsonl_query_id, read_qrels, read_queries, text_queries_format
from logicrank.schemas.errors import UserError


def prepare_dataset(d: Dataset, out: Path) -> tuple[Path, Path, Path]:
    """(corpus, queries, qrels) of the dataset; a conversion or a sample is written under ``out``."""
    if d.bundled is not None:
        from logicrank.pipelines import datasets

        data = getattr(datasets, d.bundled)()
        corpus, root, qrels = Path(data.corpus), Path(data.queries).parent, str(Path(data.qrels).relative_to(Path(data.queries).parent))
    else:
        if d.rulebench is not None:
            from logicrank.pipelines.datasets.rulebench import to_beir

            r = d.rulebench
            to_beir(maybe(r.dir), out / "beir", maybe(r.rules), maybe(r.queries), split=r.split, name=r.name)
            root, qrels = out / "beir", "qrels/test.tsv"
        elif d.qa is not None:
            from logicrank.pipelines.datasets.qa import to_beir as qa_to_beir

            qa_to_beir(d.qa, out / "beir", maybe(d.qa_src), maybe(d.qa_corpus))
            root, qrels = out / "beir", "qrels/test.tsv"
        elif d.setlogic is not None:
            from logicrank.pipelines.generate.setlogic import generate

            generate(out / "data", per_template=d.setlogic.per_template, seed=d.setlogic.seed)
            root, qrels = out / "data", "qrels/test.tsv"
        elif d.synthetic is not None:
            from logicrank.pipelines import datasets
            from logicrank.pipelines.generate.synthetic import generate as synthetic

            synthetic(datasets.scifact().corpus, out / "data", per_template=d.synthetic.per_template, seed=d.synthetic.seed)
            root, qrels = out / "data", d.qrels
        elif d.irds is not None:
            from logicrank.pipelines.datasets.registry import DatasetError, irds_to_beir

            try:
                root, qrels = irds_to_beir(d.irds, out / "irds"), "qrels/test.tsv"
            except DatasetError as exc:
                raise ExperimentError(f"dataset {exc}") from None
        elif d.corpus is not None:
            return _from_files(d, out)
        else:
            root, qrels = Path(expand(d.beir)), d.qrels
        missing = [str(f) for f in (root / "queries.jsonl", root / qrels) if not f.is_file()]
        if not (root / "corpus.jsonl").is_file() and not (root / "corpus.jsonl.gz").is_file():
            missing.insert(0, str(root / "corpus.jsonl"))
        if missing:
            raise ExperimentError(f"dataset {d.label}: no {', '.join(missing)} (a BEIR directory holds corpus.jsonl(.gz), queries.jsonl and {qrels})")
        corpus = root
    queries, qrels_path = sample_queries(root, d.sample, d.seed, out / "sample", qrels=qrels, ids=d.query_ids)
    return corpus, queries, qrels_path


def _from_files(d: Dataset, out: Path) -> tuple[Path, Path, Path]:
    """(corpus, queries, qrels) of a dataset given as three files in any format the jobs read:
    the queries and qrels read by the readers `retrieve` and `evaluate` use and written as a
    BEIR queries.jsonl and qrels/test.tsv under ``out/data`` (so sampling and grouping read
    one form); the corpus stays where it is, read by the index job in its ``format``."""
    from logicrank.pipelines.io import read_qrels, read_queries

    corpus, queries, qrels = (Path(expand(p)) for p in (d.corpus, d.queries, d.qrels))
    missing = [f"{what} {p}" for what, p in (("corpus", corpus), ("queries", queries), ("qrels", qrels)) if not p.exists()]
    if missing:
        raise ExperimentError(f"dataset: no such path: {'; '.join(missing)}")
    try:
        asked, judged = read_queries(queries, d.topics_field), read_qrels(qrels)
    except UserError as exc:
        raise ExperimentError(f"dataset: {exc}") from None
    root = out / "data"
    logical = asked.column("logical_query").to_pylist() if "logical_query" in asked.column_names else [None] * asked.num_rows
    fields = _query_fields(queries)  # (what group_by reads: a template, a metadata object)
    write_text_atomic("".join(json.dumps({**fields.get(q, {}), "_id": q, "text": t, **({"logical_query": lq} if lq else {})}) + "\n"
                              for q, t, lq in zip(asked.column("query_id").to_pylist(), asked.column("text").to_pylist(), logical, strict=True)),
                      root / "queries.jsonl")
    write_text_atomic("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{doc}\t{r}\n" for q, doc, r in zip(
        *(judged.column(c).to_pylist() for c in ("query_id", "doc_id", "relevance")), strict=True)), root / "qrels" / "test.tsv")
    q, r = sample_queries(root, d.sample, d.seed, out / "sample", qrels="qrels/test.tsv", ids=d.query_ids)
    return corpus, q, r


def _query_fields(path: Path) -> dict[str, dict]:
    """Query id -> the other fields of its record in a JSON Lines or Parquet queries file (a
    template, a metadata object: what ``group_by`` reads), its ids and logical query aside;
    none from TSV queries or TREC topics, which hold a text alone."""
    import pyarrow.parquet as pq

    path = path / "queries.jsonl" if path.is_dir() else path
    drop = {*QUERY_ID_KEYS, "logical_query"}
    if path.suffix.lower() in (".parquet", ".pq"):
        rows = pq.read_table(path).to_pylist()
        key = next(k for k in QUERY_ID_KEYS if rows and k in rows[0])
        return {str(r[key]): {k: v for k, v in r.items() if k not in drop} for r in rows} if rows else {}
    with open_text(path) as f:
        if text_queries_format(f, path) != "jsonl":  # TSV queries, TREC topics
            return {}
    return {jsonl_query_id(obj, path, n): {k: v for k, v in obj.items() if k not in drop}
            for n, obj in read_jsonl(path, "queries", ExperimentError)}


def gold_of(gold: Path, queries: Path, to: Path) -> Path:
    """The gold answers of the queries run: ``gold`` itself, or its lines of a sample's
    queries written to ``to`` (a gold question without an answer would score 0)."""
    if not gold.is_file():
        raise ExperimentError(f"gold answers: no file at {str(gold)!r} (prepare-qa writes one; prepare-rulebench when every record has a "
                              "text output, and says which has none)")
    keep = set(group_of(queries, None))
    records = []  # (read as JSON Lines are: a line ends at a newline only, never at a U+2028 inside an answer)
    for n, obj in read_jsonl(gold, "gold answers", ExperimentError):
        if "query_id" not in obj:
            raise ExperimentError(f"gold answers {gold}: line {n} has no query_id; every gold record names its query.")
        records.append(obj)
    kept = [obj for obj in records if str(obj["query_id"]) in keep]
    if len(kept) == len(records):
        return gold
    write_text_atomic("".join(json.dumps(obj) + "\n" for obj in kept), to)
    return to


def sample_queries(beir: Path, n: int | None, seed: int, out: Path, qrels: str = "qrels/test.tsv",
                   ids: tuple[str, ...] | None = None) -> tuple[Path, Path]:
    """The queries and qrels of a BEIR directory to run: all of them, ``n`` drawn with
    ``seed`` among the queries the qrels judge, or those of ``ids`` (both files cut to the
    same queries, in ``out``: evaluation averages over the qrels' queries)."""
    queries, qrels = beir / "queries.jsonl", beir / qrels
    if n is None and ids is None:
        return queries, qrels
    # the judgements as evaluation reads them (a BEIR header or none, TREC's four fields, comments)
    table = read_qrels(qrels)
    judged = set(table.column("query_id").to_pylist())
    # drawn among the queries the qrels judge (evaluation averages over those): a BEIR queries
    # file may hold other splits' queries too. Each query's id as the run reads it (any of the
    # id keys, a byte order mark, gzip: read_queries), beside its whole record
    qids = read_queries(queries).column("query_id").to_pylist()
    records = [obj for _, obj in read_jsonl(queries, "queries", ExperimentError)]
    kept = [(q, obj) for q, obj in zip(qids, records, strict=True) if q in judged]
    lines = [json.dumps(obj) for _, obj in kept]
    if ids is not None:
        position = {q: i for i, (q, _) in enumerate(kept)}
        missing = [q for q in ids if q not in position]
        if missing:
            raise ExperimentError(f"dataset query_ids: {missing[:5]} not among the queries the qrels judge ({len(missing)} of {len(ids)})")
        picked = sorted({position[q] for q in ids})
    elif not 1 <= n <= len(lines):
        raise ExperimentError(f"dataset sample {n}: must be between 1 and {len(lines)} (the queries the qrels judge)")
    else:
        picked = sorted(random.Random(seed).sample(range(len(lines)), n))
    keep = {kept[i][0] for i in picked}
    out_q, out_r = out / "queries.jsonl", out / "qrels.tsv"
    write_text_atomic("".join(lines[i] + "\n" for i in picked), out_q)
    cut = table.filter(pc.is_in(table.column("query_id"), value_set=pa.array(sorted(keep), pa.string())))
    write_text_atomic("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in zip(
        *(cut.column(c).to_pylist() for c in ("query_id", "doc_id", "relevance")), strict=True)), out_r)  # BEIR's TSV
    return out_q, out_r


def dataset_root(d: Dataset, out: Path) -> Path:
    """The directory the dataset's files are in (before any sample)."""
    if d.bundled is not None:
        from logicrank.pipelines import datasets

        return Path(getattr(datasets, d.bundled)().queries).parent
    if d.beir is not None:
        return Path(expand(d.beir))
    if d.irds is not None:
        return out / "irds"
    return out / ("data" if d.setlogic is not None or d.synthetic is not None or d.corpus is not None else "beir")



def expand(path: str) -> str:
    """``path`` with its environment variables expanded; one unset, or one opening the path set
    to nothing (``${DATA}`` read as ``.``, ``${DATA}/ulogic`` as the root's ulogic), is refused."""
    expanded = os.path.expandvars(path)
    if "$" in expanded:
        raise ExperimentError(f"dataset path {path!r}: an environment variable in it is not set")
    if (first := re.match(r"\$\{(\w+)\}|\$(\w+)", path)) and os.environ.get(name := first.group(1) or first.group(2)) == "":
        raise ExperimentError(f"dataset path {path!r}: the environment variable {name} is set to nothing")
    if not expanded.strip():
        raise ExperimentError(f"dataset path {path!r}: it is empty")
    return expanded


def maybe(path: str | None) -> str | None:
    return expand(path) if path else None



def group_of(queries: Path, column: str | None) -> dict[str, str]:
    """query id -> its value of ``column`` (a top-level field of the queries file, or under
    metadata; None: the id itself)."""
    groups = {}
    for n, row in read_jsonl(queries, "group_by: queries", ExperimentError):
        qid = jsonl_query_id(row, queries, n)  # as the runs read it (the first of the id keys it has)
        metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        value = qid if column is None else row.get(column, metadata.get(column))
        if value is None:
            raise ExperimentError(f"group_by {column!r}: query {qid} has no such field")
        groups[qid] = str(value)
    return groups


