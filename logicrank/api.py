"""The notebook API (exported as ``logicrank.*``): open a table, build pipelines, retrieve, evaluate, compare.

Everything here runs in this process, without Ray: the pipelines run through the same
runner the retrieve job uses (pipelines/retrieval/runner.py), so a run made here equals the job's.
The CLI's jobs (``logicrank index``, ``retrieve``, ...) are for corpora and query sets that
want a cluster; this is for looking at one. docs/python-api.md walks through it::

    import logicrank as lr

    table = lr.open_table("runs/scifact/lancedb")  # made by `logicrank index`; the encoder from the table
    table.search('"malaria" AND NOT "children"', lr.bm25(k=100) >> lr.itlr(scorer="bm25"))  # a DataFrame
    results = lr.retrieve(table, "pipelines/datasets/scifact/queries.jsonl", {"bm25": "bm25", "itlr": lr.bm25() >> lr.itlr()})
    ev = lr.evaluate(results, "pipelines/datasets/scifact/qrels/test.tsv", ["nDCG@10"])
    ev.summary, ev.compare(baseline="bm25")
    lr.run_experiment("scifact", table=table)  # a whole benchmark (jobs/experiments/scifact.yaml), here
    lr.run_experiment("scifact")  # the same through the jobs (index, retrieve, evaluate) on a local Ray cluster
    lr.index("corpus.jsonl", "runs/my-db")  # `logicrank index` from Python (the index job, on a local Ray cluster)
"""

from __future__ import annotations

import contextlib
import json
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from logicrank.pipelines.config.settings import EmbedConfig, LLMConfig
from logicrank.pipelines.evaluation.runs import Evaluation as _Evaluation
from logicrank.pipelines.evaluation.runs import evaluate_runs
from logicrank.pipelines.evaluation.significance import compare as _compare
from logicrank.pipelines.io import TopicsError, queries_table, read_qrels, read_queries, read_run
from logicrank.pipelines.retrieval.options import StageOptions
from logicrank.pipelines.retrieval.pipeline import Pipeline, PipelineError, compose, parse_pipelines, preset_names, read_presets
from logicrank.pipelines.retrieval.pipeline import read_pipelines as _read_pipelines
from logicrank.pipelines.retrieval.runner import Result, StageCache
from logicrank.pipelines.retrieval.stages import Context, stages
from logicrank.schemas.errors import UserError, first_line, validation_line  # UserError: every mistake in the input (one line)
from logicrank.schemas.tables import AGGREGATE_QUERY_ID, RUN, conform

__all__ = ["Evaluation", "Pipeline", "PipelineError", "Result", "Results", "StageCache", "Table", "UnknownName", "compare", "compose",
           "evaluate", "index", "open_table", "preset", "read_pipelines", "read_qrels", "read_queries", "read_run", "retrieve", "run_experiment",
           "stage", "UserError"]

DEFAULT_MEASURES = ("nDCG@10", "P@1", "R@100", "MRR", "MAP", "F1@10")
QUERY_FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".tsv", ".tsv.gz", ".parquet", ".pq", ".txt", ".xml", ".trec")


class UnknownName(UserError, AttributeError):
    """A name ``logicrank`` does not have (``lr.bm52``): the line lists the stage factories.
    An AttributeError too, so ``hasattr`` and ``getattr(lr, name, default)`` work."""


class Table:
    """A LanceDB table of documents (made by ``logicrank index``) at one version, with the
    encoder its vectors came from and, given an LLM config, an LLM in this process (its
    checkpoint is prepared here; the engine starts on the first prompt the cache misses).
    Use it as the ``table`` of :func:`retrieve`; :meth:`search` answers one query,
    :meth:`doc` fetches one document."""

    def __init__(self, db: str | Path, name: str = "docs", version: int | None = None, embed: EmbedConfig | None = None,
                 llm: LLMConfig | None = None):
        import sys

        from logicrank.pipelines.engines.store import DocStore

        if embed is not None and not isinstance(embed, EmbedConfig):
            raise PipelineError(f"open_table: embed is an lr.EmbedConfig(model=...), not {type(embed).__name__}.")
        if llm is not None and not isinstance(llm, LLMConfig):
            raise PipelineError(f"open_table: llm is an lr.LLMConfig(model=...), not {type(llm).__name__}.")
        store = DocStore(str(db), name)
        if not store.exists():
            raise PipelineError(f"open_table: {store.absent()}; make one with `logicrank index`.")
        # the version given (any one, on purpose), else the last one a completed index run finished
        store, self.note = store.readable(version, "open_table", option="open_table(..., version={v})")
        self.store = DocStore(str(db), name, version=store.version)  # pinned: every pipeline reads this version
        if self.note:
            print(self.note, file=sys.stderr)
        self.embed = embed or table_embed(self.store.model_id())  # the table's own encoder unless told
        self.llm_config = llm
        self._encoder = self._llm = None
        self.context = Context(self.store, encoder=self._encoder_once, llm=self._llm_once,
                               llm_model=None if llm is None else str(self._llm_once().model_dir))

    @property
    def version(self) -> int:
        return self.store.version

    def __len__(self) -> int:
        return self.store.count()

    def __repr__(self) -> str:
        return f"Table({self.store.uri!r}, {self.store.name!r}, version={self.version}, documents={len(self)})"

    def doc(self, doc_id: str) -> dict[str, Any]:
        """One document: ``{"doc_id", "title", "text", "metadata"}`` (metadata: the corpus's
        JSON object as a dict, or None). An id the table lacks raises :class:`PipelineError`."""
        if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
            raise PipelineError(f"table.doc: a document id is a string, not {type(doc_id).__name__}.")
        rows = self.store.rows_for([str(doc_id)], ["title", "text", "metadata"]).to_pylist()
        if not rows:
            raise PipelineError(f"table.doc: no document {str(doc_id)!r} in table {self.store.name!r} (version {self.version}).")
        row = rows[0]
        if row.get("metadata"):
            with contextlib.suppress(ValueError):  # else kept as the text it is
                row["metadata"] = json.loads(row["metadata"])
        return row

    def search(self, query: str, pipeline: Any = "bm25", k: int | None = None, logical_query: str | None = None, cache: Any = None):
        """Answer one query: its ranked results as a DataFrame (query_id ``"1"``, doc_id, rank,
        score, title, text), best first. ``query``: a string that parses as a logical query
        (quoted terms with AND, OR, NOT and parentheses: ``'"malaria" AND NOT "children"'``)
        is the query's ``logical_query``, its text the terms in words (``malaria and not
        children``); a string that looks like one and does not parse (an unterminated quote,
        typographic quotes, ``-"x"``, upper-case AND, OR, NOT between unquoted words) is refused
        (:class:`UserError`); any other string is the query's text. ``logical_query`` gives both apart.
        ``pipeline``: a :class:`Pipeline`, a preset name (``"bm25"``), a stage
        (``lr.bm25(k=20)``), a composition (``lr.bm25() >> lr.itlr()``) or a list of stages
        (``["bm25", {"itlr": {"scorer": "bm25"}}]``). ``k``: the top k of the run; where the
        pipeline's last top-k stage keeps fewer, or it fuses lists all shallower than k, the
        pipeline is deepened to k first, as the job's ``--k`` deepens a run (a reranker keeps at
        most what it reranks)."""
        if not isinstance(query, str) or not query.strip():
            raise PipelineError(f"table.search: a query is a non-blank string, not {query!r:.60}.")
        if logical_query is not None and not isinstance(logical_query, str):
            raise PipelineError(f"table.search: logical_query is a string ('\"a\" AND NOT \"b\"'), not {type(logical_query).__name__}.")
        if logical_query is not None and not logical_query.strip():
            raise PipelineError("table.search: logical_query is blank; give a logical query ('\"a\" AND NOT \"b\"') or leave it out.")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise PipelineError(f"table.search: k is a positive integer, not {k!r:.60}.")
        text, logical = query, logical_query
        pipe = as_pipeline(pipeline, "search", "table.search")
        from logicrank.pipelines.retrieval.overrides import depth_stages

        # deepened to k, as --k deepens a run, where the run could come out shorter than k: its top-k stage keeps fewer, or
        # (a fusion) every list it fuses is shallower; a depth left to a file or to the input (None) is cut by rank below
        top, *fused = [getattr(o, type(o).depth_option) for o in depth_stages(pipe.stages)] or [None]
        fused = [d for d in fused if d is not None]
        if k is not None and ((top is not None and k > top) or (fused and k > max(fused))):
            from logicrank.pipelines.retrieval.pipeline import with_sets

            pipe = Pipeline(pipe.name, with_sets({pipe.name: pipe.stages}, None, k)[pipe.name])
        if logical is None and (node := _logical(query)) is not None:
            text, logical = _words(node), query
            _require_logic(pipe, node, query)
        elif logical is not None and (node := _logical(logical)) is not None:  # given apart: the same guard
            _require_logic(pipe, node, logical)
        queries = queries_table(pa.table({"query_id": ["1"], "text": [text], "logical_query": pa.array([logical], pa.string())}),
                                "table.search")
        pipe.validate(frozenset(queries.column_names))
        run = pipe.run(self.context, queries, stage_cache(cache, "table.search")).run
        if k is not None:
            run = run.filter(pc.less_equal(run.column("rank"), k))
        frame = run.select(["query_id", "doc_id", "rank", "score"]).to_pandas()
        docs = self.store.rows_for(frame["doc_id"].tolist(), ["title", "text"]).to_pandas()
        return frame.merge(docs, on="doc_id", how="left").sort_values("rank", kind="stable").reset_index(drop=True)

    def _encoder_once(self):
        if self._encoder is None:
            from logicrank.pipelines.engines.embed import Embedder, model_id
            from logicrank.pipelines.engines.vector_models import require_query_model

            require_query_model(self.store, model_id(self.embed), "open_table", "give open_table(embed=...) the table's model")
            self._encoder = Embedder(self.embed)
        return self._encoder

    def _llm_once(self):
        if self._llm is None:
            if self.llm_config is None:
                raise PipelineError("a pipeline asks the LLM: give open_table(llm=LLMConfig(model=...)).")
            from logicrank.pipelines.llm.engine import LocalLLM

            self._llm = LocalLLM(self.llm_config)
        return self._llm


def table_embed(recorded: str | None) -> EmbedConfig:
    """The encoder a table records (its ``logicrank.model``: the model, ``@seq<N>`` for a token
    window), as an :class:`EmbedConfig`; the default one for a table that records none."""
    if not recorded:
        return EmbedConfig()
    model, window = recorded, None
    if (m := re.fullmatch(r"(.+)@seq(\d+)", recorded)) is not None:
        model, window = m.group(1), int(m.group(2))
    return EmbedConfig(model=model, max_seq_length=window)


def open_table(db: str | Path, name: str = "docs", version: int | None = None, embed: EmbedConfig | None = None,
               llm: LLMConfig | None = None) -> Table:
    """The table ``name`` in the LanceDB database ``db``: ``version`` (a number or a tag) when
    given, else the last version a completed ``logicrank index`` run finished. A newer version
    left by a run that did not finish is not read, and a line on stderr says so (also kept as
    ``Table.note``); a table no index run completed is refused (:class:`UserError`). ``embed``:
    the query encoder, by default the model the table records (the index job writes it); one
    that disagrees with the table is refused when a pipeline first encodes."""
    return Table(db, name, version, embed, llm)


def index(corpus: str | Path, db: str | Path, table: str = "docs", out: str | Path = "runs/index", embed: EmbedConfig | None = None,
          ray: Any = None, progress: bool = False, **options: Any):
    """Index ``corpus`` (a BEIR directory, JSONL(.gz), Parquet, TREC SGML or TSV; a file or a
    directory) into table ``table`` of the LanceDB database ``db``, incrementally by content
    hash: the index job of ``logicrank index`` (jobs/index.py), on a local Ray cluster or the one
    ``ray`` names (``lr.RayConfig(address=...)``). Returns its summary (``inserted``,
    ``updated``, ``unchanged``, ``deleted``, ``rejected``, ``table_version``, ``tag``, ...);
    ``out``: its run directory (manifest, rejects). ``embed``: the encoder (default
    all-MiniLM-L6-v2); ``options``: the other fields of :class:`IndexConfig` (``format``,
    ``delete_missing``, ``tag``, ...). A bad option, a corpus that cannot be read or a refused
    snapshot is a :class:`UserError` (one line). Safe in a script without an
    ``if __name__ == "__main__":`` guard: no process it starts imports the caller's script."""
    from pydantic import ValidationError

    from logicrank.jobs.index import run_index
    from logicrank.pipelines.config.settings import IndexConfig

    if embed is not None and not isinstance(embed, EmbedConfig):
        raise PipelineError(f"index: embed is an lr.EmbedConfig(model=...), not {type(embed).__name__}.")
    try:
        cfg = IndexConfig.model_validate({"corpus": str(corpus), "db": str(db), "table": table, **options,
                                          **({"embed": embed} if embed is not None else {}), **({"ray": ray} if ray is not None else {})})
    except ValidationError as exc:
        raise PipelineError(f"index: {validation_line(exc, IndexConfig)}.") from None
    return run_index(cfg, out, progress=progress)


def read_pipelines(spec: Mapping[str, Any] | str | Path, set: Mapping[str, Any] | Sequence[str] | None = None) -> dict[str, Pipeline]:
    """Named pipelines from a mapping (run id -> stages, as in a pipelines file) or a YAML
    file (docs/pipelines.md), with the overrides ``set`` (``{"orlog.k": 20}`` or
    ``["orlog.k=20"]``, the ``--set`` grammar), each validated."""
    if not isinstance(spec, (Mapping, str, Path)):
        raise PipelineError(f"read_pipelines: give a mapping (run id -> stages) or a pipelines file, not {type(spec).__name__}.")
    return _read_pipelines(spec, set)


def preset(*methods: str, set: Mapping[str, Any] | Sequence[str] | None = None) -> dict[str, Pipeline]:
    """``--method`` presets (pipelines/retrieval/presets/) as pipelines, with the overrides ``set``, e.g.
    ``preset("bm25", "orlog", set={"orlog/bm25.k": 50})`` (OrLog over BM25's top 50; ``bm25.k`` would
    set every pipeline's bm25 stage, the bm25 run's too)."""
    bad = [m for m in methods if not isinstance(m, str) or m not in preset_names()]
    if bad:
        raise PipelineError(f"preset: unknown preset {bad[0]!r}; presets: {', '.join(preset_names())}.")
    return {rid: Pipeline(rid, stages) for rid, stages in read_presets(methods, sets=set).items()}


def stage(name: str, /, **options: Any) -> StageOptions:
    """The stage ``name`` with ``options``, checked as a pipelines file's are: ``stage("bm25",
    k=100)``, also written ``lr.bm25(k=100)`` (one such factory per registered stage). Stages
    and pipelines compose with ``>>``: ``lr.bm25(k=100) >> lr.itlr(scorer="bm25")``."""
    known = stages()
    if name not in known:
        raise UnknownName(f"no stage {name!r}; stages: {', '.join(sorted(known))} (lr.<stage>(**options)).")
    cls = known[name].Options
    from pydantic import ValidationError

    try:
        return cls(**options)
    except ValidationError as exc:
        raise PipelineError(f"lr.{name}(): {validation_line(exc, cls)}.") from None


def stage_factory(name: str):
    """``lr.<name>``: :func:`stage` of ``name``, documented with the stage's docstring and options."""
    cls = stages()[name]

    def factory(**options: Any) -> StageOptions:
        return stage(name, **options)

    factory.__name__ = factory.__qualname__ = name
    fields = ", ".join(f for f in cls.Options.model_fields if f != "stage")
    factory.__doc__ = f"The {name} stage ({cls.kind.value}): {' '.join((cls.__doc__ or '').split())} Options: {fields or 'none'}."
    return factory


def __getattr__(name: str) -> Any:  # ``api.bm25``: a stage factory, as ``lr.bm25``
    if not name.startswith("_") and name in stages():
        return stage_factory(name)
    raise AttributeError(f"module 'logicrank.api' has no attribute {name!r}")


def as_pipeline(spec: Any, name: str, where: str) -> Pipeline:
    """``spec`` as a pipeline named ``name`` (a Pipeline given keeps its stages): a
    :class:`Pipeline`, a preset name, a stage's options or a list of stages (config form or
    options)."""
    if isinstance(spec, Pipeline):
        stages_ = spec.stages
    elif isinstance(spec, StageOptions):
        stages_ = (spec,)
    elif isinstance(spec, str):
        if spec not in preset_names():
            raise PipelineError(f"{where}: unknown preset {spec!r}; presets: {', '.join(preset_names())} "
                                f"(or give a Pipeline, a list of stages or lr.bm25(...) >> ...).")
        (stages_,) = read_presets([spec]).values()
    elif isinstance(spec, (list, tuple)):
        try:
            stages_ = parse_pipelines({name: list(spec)})[name]
        except ValueError as exc:
            raise PipelineError(f"{where}: {first_line(exc)}") from None
    else:
        raise PipelineError(f"{where}: a pipeline is a Pipeline, a preset name, a stage (lr.bm25()) or a list of stages, "
                            f"not {type(spec).__name__}.")
    try:
        parse_pipelines({name: list(stages_)})  # the name is a run id
    except ValueError as exc:
        raise PipelineError(f"{where}: {first_line(exc)}") from None
    pipeline = Pipeline(name, tuple(stages_))
    pipeline.validate()
    return pipeline


def as_pipelines(pipes: Any) -> list[Pipeline]:
    """What :func:`retrieve` runs: a mapping run id -> pipeline (any form :func:`as_pipeline`
    takes; the key names the run), pipelines (each its own name), or one pipeline."""
    if isinstance(pipes, Mapping):
        bad = [k for k in pipes if not isinstance(k, str)]
        if bad:
            raise PipelineError(f"retrieve: a run id is a string, not {bad[0]!r}.")
        out = [as_pipeline(p, rid, f"retrieve: run {rid!r}") for rid, p in pipes.items()]
    elif isinstance(pipes, (Pipeline, StageOptions, str)):
        out = [as_pipeline(pipes, pipes.name if isinstance(pipes, Pipeline) else pipes if isinstance(pipes, str) else pipes.stage,
                           "retrieve")]
    elif isinstance(pipes, Iterable):
        pipes = list(pipes)
        if sum(isinstance(p, StageOptions) for p in pipes) >= 2:  # table.search reads such a list as one pipeline
            raise PipelineError("retrieve: a list of stages is one pipeline to table.search and several runs here; give "
                                "lr.bm25() >> lr.itlr() for one pipeline, or a mapping {'a': lr.bm25(), 'b': lr.dense()} for several runs.")
        out = []
        for p in pipes:
            if isinstance(p, Pipeline):
                out.append(as_pipeline(p, p.name, "retrieve"))
            elif isinstance(p, (str, StageOptions)):
                out.append(as_pipeline(p, p if isinstance(p, str) else p.stage, "retrieve"))
            else:
                raise PipelineError(f"retrieve: in a list, give Pipelines, preset names or stages, not {type(p).__name__}; "
                                    "a mapping names them: {'mine': [...]}.")
        names = [p.name for p in out]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise PipelineError(f"retrieve: run ids repeat: {dup}; name each pipeline with a mapping {{run id: pipeline}}.")
    else:
        raise PipelineError(f"retrieve: pipes is a mapping (run id -> pipeline), a list of pipelines or one pipeline, "
                            f"not {type(pipes).__name__}.")
    if not out:
        raise PipelineError("retrieve: give at least one pipeline.")
    return out


def looks_like_path(text: str) -> bool:
    """A queries string meant as a file: one line ending in one of the queries files' suffixes
    (``HIV/AIDS treatment`` is a query; ``runs/q.jsonl`` a file)."""
    return "\n" not in text and text.strip().lower().endswith(QUERY_FILE_SUFFIXES)


def _existing(text: str) -> str | None:
    """``"file"`` or ``"dir"`` where ``text`` names one (a text too long for a path name is
    none), else None."""
    try:
        path = Path(text)
        return "file" if path.is_file() else "dir" if path.is_dir() else None
    except (OSError, ValueError):
        return None


def as_queries(queries: Any, where: str = "retrieve") -> pa.Table:
    """Queries in any form as the QUERIES table (ids as strings, a repeated id refused): a
    queries file (path), an Arrow table, a pandas DataFrame, a list of dicts (query_id, text,
    optionally logical_query) or one string: an existing file's path, else one query's text
    (id ``"1"``); a string that looks like a path (:func:`looks_like_path`) but names no file,
    or that names a directory, is refused."""
    source = f"{where}: queries"
    if isinstance(queries, Path):
        return read_queries(queries)
    if isinstance(queries, str):
        if not queries.strip():
            raise TopicsError(f"{source}: a blank string; give a query's text, a queries file or a table.")
        found = _existing(queries)
        if found == "file":
            return read_queries(queries)
        if found == "dir":  # (read_queries would read its queries.jsonl: a query's text that names a folder here is not one)
            raise TopicsError(f"{source}: {queries!r} names a directory; give Path({queries!r}) to read its queries.jsonl, "
                              f"or a table to ask a query of that text.")
        if looks_like_path(queries):
            raise TopicsError(f"{source}: no file at {queries!r} (a string that looks like a path is not read as a query's text).")
        return queries_table(pa.table({"query_id": ["1"], "text": [queries]}), source)
    if isinstance(queries, pa.Table):
        return queries_table(queries, source)
    if type(queries).__module__.startswith("pandas") and hasattr(queries, "columns"):
        try:
            # an id column of objects: its integers as their decimal text (floats, booleans stay, for queries_table to refuse)
            ids = {c: queries[c].map(_int_as_text) for c in queries.columns if c in ("query_id", "_id", "qid", "id") and queries[c].dtype == object}
            table = pa.Table.from_pandas(queries.assign(**ids), preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise TopicsError(f"{source}: the DataFrame does not convert to a table: {first_line(exc)}") from None
        return queries_table(table, source)
    if isinstance(queries, (list, tuple)):
        if not queries:
            raise TopicsError(f"{source}: no queries (the list is empty); give the queries to run.")
        bad = [i for i, q in enumerate(queries) if not isinstance(q, Mapping)]
        if bad:
            raise TopicsError(f"{source}: item {bad[0]} is a {type(queries[bad[0]]).__name__}; give dicts like "
                              "{'query_id': '1', 'text': '...'} (optionally 'logical_query').")
        rows = [{k: (_int_as_text(v) if k in ("query_id", "_id", "qid", "id") else v) for k, v in q.items()} for q in queries]
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise TopicsError(f"{source}: the dicts do not make a table: {first_line(exc)}") from None
        return queries_table(table, source)
    raise TopicsError(f"{source}: give a queries file, a query's text, an Arrow table, a DataFrame or a list of dicts, "
                      f"not {type(queries).__name__}.")


def _int_as_text(value: Any) -> Any:
    """An integer id (Python's or numpy's) as its decimal text (as a JSONL query's); any other
    value as it is."""
    return str(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value


def stage_cache(cache: Any, where: str) -> StageCache:
    """``cache`` (None, a directory or a :class:`StageCache`) as a StageCache."""
    if isinstance(cache, StageCache):
        return cache
    if cache is not None and not isinstance(cache, (str, Path)):
        raise PipelineError(f"{where}: cache is a directory or a StageCache, not {type(cache).__name__}.")
    return StageCache(cache)


class Results(dict):
    """What :func:`retrieve` returns: run id -> :class:`Result` (``.run``: the RUN table,
    ``.side``: side tables by name, ``.steps``: a step per stage, ``.to_pandas()``), in the
    order the pipelines were given; a pipeline that found nothing is a key with an empty run.
    Pass it to :func:`evaluate` as it is."""

    @property
    def run(self) -> pa.Table:
        """Every run as one RUN table."""
        return pa.concat_tables([r.run for r in self.values()]) if self else RUN.empty_table()

    def to_pandas(self):
        return self.run.to_pandas()


def retrieve(table: Table, queries: Any, pipes: Any, cache: StageCache | str | Path | None = None, **removed: Any) -> Results:
    """Run each pipeline on ``queries`` (:func:`as_queries`: a file, a query's text, a table, a
    DataFrame, a list of dicts); returns :class:`Results`, run id -> :class:`Result`. ``pipes``:
    a mapping run id -> pipeline (a :class:`Pipeline`, a preset name, a stage, ``a >> b``, a
    list of stages), a list of pipelines, or one. ``cache``: a :class:`StageCache` or a
    directory to keep stage outputs in (pipelines that share a prefix compute it once either
    way); keyed as the retrieve job keys them, so a job's ``<out>/stages`` answers the same
    pipelines on the same queries and table, and a stage whose code changed since is computed
    again (docs/pipelines.md)."""
    if removed:
        raise PipelineError(f"retrieve: no option {', '.join(sorted(removed))}; retrieve returns {{run id: Result}} "
                            "(results[rid].side, .steps; results.run or .to_pandas() for every run).")
    if not isinstance(table, Table):
        raise PipelineError(f"retrieve: table is lr.open_table(...), not {type(table).__name__}.")
    one = isinstance(queries, str) and queries.strip() and _existing(queries) is None and not looks_like_path(queries)
    node = _logical(queries) if one else None
    if node is not None:  # one logical query's string, read as table.search reads it: its text is the formula's words
        original, queries = queries, [{"query_id": "1", "text": _words(node), "logical_query": queries}]
    queries = as_queries(queries, "retrieve")
    cache = stage_cache(cache, "retrieve")
    pipes = as_pipelines(pipes)
    for p in pipes:
        p.validate(frozenset(queries.column_names))  # every pipeline before any runs
        if node is not None:  # (a queries file has its own text: a pipeline that reads only the text never sees the NOT's words)
            _require_logic(p, node, original, "retrieve")
    return Results((p.name, p.run(table.context, queries, cache)) for p in pipes)


class Evaluation:
    """What :func:`evaluate` returns: ``metrics`` (the METRICS table: per-query values, means
    under query ``all``), ``per_query`` (those values, a long DataFrame without the means),
    ``summary`` / :meth:`to_pandas` (run x measure means, a wide DataFrame, each run's depth first), :meth:`compare`
    (significance against a baseline) and ``evaluation`` (the evaluation underneath: notes,
    :meth:`markdown`, :meth:`plot`)."""

    def __init__(self, evaluation: _Evaluation, notes: Sequence[str] = ()):
        self.evaluation = evaluation
        self.metrics: pa.Table = evaluation.metrics
        self._notes = list(notes)  # what the evaluate job says on the terminal (identical ids, several table versions)

    @property
    def run_ids(self) -> list[str]:
        return self.evaluation.run_ids

    @property
    def measures(self) -> list[str]:
        return list(dict.fromkeys(self.metrics.column("measure").to_pylist()))

    @property
    def per_query(self):
        df = self.metrics.to_pandas()
        return df[df["query_id"] != AGGREGATE_QUERY_ID].reset_index(drop=True)

    @property
    def summary(self):
        """Run x measure means, each run's depth first (the most documents it holds for a query,
        as evaluate's report states it; NA for a run without a ranking)."""
        import pandas as pd

        df = self.metrics.to_pandas()
        df = df[df["query_id"] == AGGREGATE_QUERY_ID]
        wide = df.pivot(index="run_id", columns="measure", values="value")
        wide = wide.reindex(index=self.run_ids, columns=self.measures)
        wide.columns.name = None
        wide.insert(0, "depth", pd.array([self.evaluation.depths.get(r) for r in wide.index], dtype="Int64"))
        return wide

    def to_pandas(self):
        return self.summary

    def compare(self, baseline: str | None = None, test: str = "t-test", correction: str = "holm", alpha: float = 0.05):
        """Each other run against ``baseline`` (default the first run) on every measure: a
        paired ``test`` per query, p-values adjusted by ``correction``; a DataFrame of the
        SIGNIFICANCE columns (:func:`compare` gives the Arrow table)."""
        return compare(self.metrics, baseline or self.run_ids[0], test, correction, alpha).to_pandas()

    def notes(self) -> list[str]:
        return [*self.evaluation.notes(), *self._notes]

    def markdown(self, title: str = "Evaluation", plot: str | None = None) -> str:
        """The report evaluate's report.md is, its significance section included (each run
        against the first, as :meth:`compare`'s defaults), and the notes the job prints."""
        from logicrank.pipelines.evaluation.report import markdown_report

        ev = self.evaluation
        significance = ev.significance if ev.significance is not None or len(self.run_ids) < 2 else compare(self.metrics, ev.baseline)
        return markdown_report(ev.metrics, significance, plot, title, self.notes(), ev.depths)

    def plot(self, path: str | Path) -> Path:
        return self.evaluation.plot(path)

    def __repr__(self) -> str:
        return f"Evaluation(runs={self.run_ids}, measures={self.measures})\n{self.summary.round(4).to_string()}"

    def _repr_html_(self) -> str:
        return self.summary._repr_html_()


def _one_run(value: Any, where: str, key: str | None = None) -> tuple[pa.Table, list[str]]:
    """A run in any form (RUN table, DataFrame, :class:`Result`, run file) and the run ids it
    holds (a Result's or the key's even when it found nothing); under ``key`` its run_id is the key."""
    ids: list[str] = []
    if isinstance(value, Result):
        table, ids = value.run, [value.run_id]
    elif isinstance(value, pa.Table):
        table = value
    elif type(value).__module__.startswith("pandas") and hasattr(value, "columns"):
        try:
            table = pa.Table.from_pandas(value, preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise PipelineError(f"{where}: the DataFrame does not convert to a run table: {first_line(exc)}") from None
    elif isinstance(value, (str, Path)):
        from logicrank.jobs.evaluate import refuse_unfinished_retrieve

        refuse_unfinished_retrieve(Path(value).resolve())  # another run's leftovers beside a killed retrieve's files, as the job
        table = read_run(value)
    else:
        raise PipelineError(f"{where}: a run is a RUN table, a DataFrame, a Result or a run file, not {type(value).__name__}.")
    if "run_id" not in table.column_names:
        if key is None:
            raise PipelineError(f"{where}: the run has no run_id column; give a mapping {{run id: run}} to name it.")
        table = table.append_column("run_id", pa.array([key] * table.num_rows, pa.string()))
    if "method" not in table.column_names:
        table = table.append_column("method", table.column("run_id"))
    found = list(dict.fromkeys(table.column("run_id").to_pylist()))
    if key is not None:
        if len(found) > 1:
            raise PipelineError(f"{where}: run {key!r} holds several run ids {found}; give one run per key.")
        table = table.set_column(table.column_names.index("run_id"), "run_id", pa.array([key] * table.num_rows, pa.string()))
        return conform(table, RUN, where), [key]
    return conform(table, RUN, where), list(dict.fromkeys([*ids, *found]))


def evaluate(runs: Any, qrels: pa.Table | str | Path, measures: Sequence[str] = DEFAULT_MEASURES,
             run_ids: Sequence[str] | None = None, ignore_identical_ids: bool = False) -> Evaluation:
    """Evaluate ``runs`` against ``qrels`` (a table: query_id, doc_id, relevance, or a file)
    on ``measures``, trec_eval's rules (a qrels query a run misses scores 0). ``runs``: a run
    (an Arrow RUN table, a DataFrame, a :class:`Result`, a run file; every run id it holds), a
    list of runs, or a mapping run id -> run (:func:`retrieve`'s :class:`Results` as it is; a
    key whose run is empty scores 0). A run id given twice is refused. ``run_ids``: the runs to
    evaluate (default: all; one named with no rows scores 0). ``ignore_identical_ids``: drop
    the rows whose document id is their query's id, as BEIR's evaluation does (ArguAna,
    Quora; ``logicrank evaluate --ignore-identical-ids``). Returns an :class:`Evaluation`,
    whose notes say what the job says on the terminal."""
    if isinstance(runs, Mapping):
        parts = [_one_run(v, f"evaluate: run {k!r}", str(k)) for k, v in runs.items()]
    elif isinstance(runs, (list, tuple)):
        parts = [_one_run(v, f"evaluate: run {i + 1}") for i, v in enumerate(runs)]
    else:
        parts = [_one_run(runs, "evaluate")]
    seen: dict[str, int] = {}
    for i, (_, ids) in enumerate(parts, 1):
        for rid in ids:
            if rid in seen:
                raise PipelineError(f"evaluate: run id {rid!r} is in runs {seen[rid]} and {i}; give each run a distinct run_id "
                                    "(or a mapping {name: run}).")
            seen[rid] = i
    if not seen and run_ids is None:
        raise PipelineError("evaluate: no runs given.")
    if isinstance(run_ids, str) or (run_ids is not None and not all(isinstance(r, str) for r in run_ids)):
        raise PipelineError(f"evaluate: run_ids is a list of run ids, not {run_ids!r:.60}.")
    if isinstance(measures, str):
        measures = [measures]
    if not isinstance(measures, (list, tuple)) or not all(isinstance(m, str) for m in measures):
        raise PipelineError(f"evaluate: measures is a list of names (['nDCG@10', 'R@100']), not {measures!r:.60}.")
    if not isinstance(qrels, pa.Table):
        if not isinstance(qrels, (str, Path)):
            raise PipelineError(f"evaluate: qrels is a table (query_id, doc_id, relevance) or a qrels file, not {type(qrels).__name__}.")
        qrels = read_qrels(qrels)
    from logicrank.jobs.evaluate import identical_ids_note, retrieved_from, table_versions_note
    from logicrank.pipelines.evaluation.runs import without_identical_ids

    said, tables, identical = [], [], 0
    for table, _ in parts:
        kept, n = without_identical_ids(table)
        identical += n
        tables.append(kept if ignore_identical_ids else table)
    if identical:
        said.append(identical_ids_note(identical, "", ignore_identical_ids, "ignore_identical_ids=True"))
    files = [v for v in (runs.values() if isinstance(runs, Mapping) else runs if isinstance(runs, (list, tuple)) else [runs])
             if isinstance(v, (str, Path))]
    if note := table_versions_note(retrieved_from(files)):
        said.append(note)
    return Evaluation(evaluate_runs(tables, qrels, measures, run_ids=list(run_ids if run_ids is not None else seen), significance=False), said)


def compare(metrics: pa.Table | Evaluation, baseline: str, test: str = "t-test", correction: str = "holm", alpha: float = 0.05) -> pa.Table:
    """Each other run against ``baseline`` on every measure of ``metrics`` (an
    :class:`Evaluation` or its METRICS table): paired test, p-values adjusted across runs (the
    SIGNIFICANCE columns, an Arrow table; :meth:`Evaluation.compare` gives a DataFrame)."""
    if isinstance(metrics, Evaluation):
        metrics = metrics.metrics
    if not isinstance(metrics, pa.Table):
        raise PipelineError(f"compare: give lr.evaluate(...)'s result or its METRICS table, not {type(metrics).__name__}.")
    from typing import get_args

    from logicrank.pipelines.config.settings import EvaluateConfig

    # the values the evaluate job's config takes (alpha=5, for 5%, marked every run significant)
    for name, value in (("test", test), ("correction", correction)):
        if value not in (allowed := get_args(EvaluateConfig.model_fields[name].annotation)):
            raise PipelineError(f"compare: {name} {value!r}: must be one of {', '.join(map(repr, allowed))}.")
    if not (isinstance(alpha, numbers.Real) and 0 < alpha < 1):
        raise PipelineError(f"compare: alpha {alpha!r}: must be between 0 and 1 (0.05 for 5%).")
    try:
        return _compare(metrics, baseline, test, correction, alpha)
    except UserError:
        raise
    except ValueError as exc:
        raise PipelineError(f"compare: {first_line(exc)}") from None


def _logical(query: str):
    """``query`` parsed as a logical query, or None when it is plain text; one that looks like a
    logical query (:func:`~logicrank.pipelines.retrieval.logic.query.looks_logical`) and does not parse is
    refused in the line the retrieve job refuses such a queries file with."""
    from logicrank.pipelines.retrieval.logic.query import (
        QueryParseError,
        UnparsedQueryError,
        looks_logical,
        parse,
        unparsed_message,
    )

    meant = looks_logical(query)
    if '"' not in query and not meant:
        return None
    try:
        return parse(query)
    except QueryParseError as exc:
        if not meant:
            return None
        raise UnparsedQueryError(unparsed_message("table.search", [("1", query, first_line(exc))], hint=(
            'Quote each term with straight double quotes ("vitamin D" AND NOT "bone"); plain words without quotes or '
            "upper-case AND, OR, NOT are searched as text"))) from None


# the stages that read a query's logical_query (itlr as a query column; orlog and reasoner: a logical form over its atoms)
_LOGIC_STAGES = frozenset({"orlog", "reasoner"})


def _require_logic(pipe: Pipeline, node, query: str, where: str = "table.search") -> None:
    """A logical query with a NOT given to a pipeline none of whose stages reads its logic is
    refused: the stages would search its words, where the negated term raises the score of the
    documents about it. Without a NOT (a quoted phrase, an AND or OR of terms) its words are
    searched, as a plain query's are."""
    from logicrank.pipelines.retrieval.methods.itlr import negated_terms
    from logicrank.pipelines.retrieval.runner import stage_classes

    if not negated_terms(node) or any("logical_query" in cls.reads or cls.name in _LOGIC_STAGES for cls in stage_classes(pipe.stages)):
        return
    named = f"pipeline {pipe.name!r}" if where != "table.search" else "the pipeline"
    raise PipelineError(f"{where}: {query!r:.80} negates a term, and no stage of {named} reads its logic (its words would "
                        "be searched, the NOT term raising the documents about it); give a logic-aware pipeline, e.g. "
                        "pipeline=lr.bm25() >> lr.itlr(scorer=\"bm25\"), or the words as plain text.")


def _words(node) -> str:
    """A logical query's terms in words (``malaria and not children``), as the generated
    benchmarks write a query's text, its groups in parentheses where to_text keeps them
    (``cancer and not (breast or lung)``): the text an LLM stage reads means what the query does."""
    from logicrank.pipelines.retrieval.logic.query import And, Not, Or, Term

    if isinstance(node, Term):
        return node.text
    if isinstance(node, Not):
        inner = _words(node.child)
        return f"not {inner}" if isinstance(node.child, Term) else f"not ({inner})"
    grouped = (And, Or) if isinstance(node, And) else (Or,)
    return (" and " if isinstance(node, And) else " or ").join(
        f"({_words(c)})" if isinstance(c, grouped) else _words(c) for c in node.children)


def run_experiment(experiment: str | Path | Any, out: str | Path | None = None, strict: bool = True, table: Table | None = None,
                   set: Mapping[str, Any] | Sequence[str] | None = None, **placement: Any):
    """Run an experiment file (or an :class:`~logicrank.pipelines.evaluation.experiment.Experiment`, or the
    name of one that ships, e.g. ``"scifact"``); returns its ``ExperimentResult`` (summary,
    metrics, groups, reference checks, report path). ``set``: overrides (``--set``'s grammar).

    Given ``table`` (:func:`open_table` of a table indexed from the experiment's corpus), it
    runs here, in this process, without Ray. Otherwise it runs the jobs (index, retrieve,
    evaluate) on a local Ray cluster, or the one ``placement`` names
    (``ray=RayConfig(address=...)``; ``embed``, ``llm``: configs or mappings of their fields;
    the job's ``index_dir``, ``progress`` and ``echo`` too). docs/experiments.md."""
    from logicrank.pipelines.evaluation.experiment import Experiment, load, override, run_in_process, with_encoder

    exp = experiment if isinstance(experiment, Experiment) else load(experiment)
    if set:
        exp = override(exp, set)
    out = out or Path("runs/experiments") / exp.name
    if table is None:
        from pydantic import ValidationError

        from logicrank.jobs.experiment import run_experiment as run
        from logicrank.pipelines.config.settings import RayConfig

        kinds = {"embed": EmbedConfig, "ray": RayConfig, "llm": LLMConfig}
        taken = (*kinds, "progress", "echo", "index_dir")  # the job's own keywords besides the configs
        if unknown := sorted(placement.keys() - {*taken}):  # (`set` is a parameter here, not the builtin)
            raise PipelineError(f"run_experiment: no option {', '.join(unknown)}; the jobs take {', '.join(taken)}.")
        checked = dict(placement)
        for key, value in placement.items():  # a config or a mapping of its fields, checked before Ray starts
            if key in kinds and value is not None:
                try:
                    checked[key] = kinds[key].model_validate(value)
                except ValidationError as exc:
                    raise PipelineError(f"run_experiment: {key}: {validation_line(exc, kinds[key])}.") from None
        if checked.get("embed") is not None:  # the encoder given beats the file's where the two differ, as the CLI's --model does
            given = {k: getattr(checked["embed"], k) for k in checked["embed"].model_fields_set}
            if changed := {f"embed.{k}": v for k, v in given.items() if k in exp.embed and exp.embed[k] != v}:
                exp = override(exp, changed)
        return run(exp, out, strict=strict, **checked)
    if placement:
        raise PipelineError(f"run_experiment: {sorted(placement)} are options of the jobs; with a table the run is in this process "
                            "(drop them).")
    if not {"model", "max_seq_length"} & exp.embed.keys():  # (a file that fixes its encoder is refused below on another table)
        exp = with_encoder(exp, table.embed)  # a table of another encoder than the default the file was written for: unchecked
    wanted = EmbedConfig.model_validate({**table.embed.model_dump(), **exp.embed})
    if wanted != table.embed:
        raise PipelineError(f"run_experiment: experiment {exp.name} fixes embed {exp.embed}; open the table with open_table(embed=...) to match.")
    judge = None
    if "Judge" in exp.qa_measures:
        from logicrank.pipelines.evaluation.qa import llm_judge

        judge = llm_judge(table.context.llm_service())
    return run_in_process(exp, table.context, out, strict=strict, judge=judge)
