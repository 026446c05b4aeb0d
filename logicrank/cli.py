"""The `logicrank` command line: one subcommand per job.

Options build the validated configs in :mod:`logicrank.pipelines.config.settings`; a bad value or an unknown
name (model, measure, method) fails before Ray starts or a model loads.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import typer.core
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from logicrank.cli_config import EMBED, LLM, Bind, Bound, configured, option, put, read_file, repeated
from logicrank.cli_config import default as _d
from logicrank.jobs.watchdog import DEFAULT_TIMEOUT_S, watch
from logicrank.pipelines.config.retrieval import DecomposeConfig, RetrieveConfig
from logicrank.pipelines.config.settings import (
    EmbedConfig,
    EvaluateConfig,
    GenerateConfig,
    IndexConfig,
    LLMConfig,
    RayConfig,
)
from logicrank.pipelines.files import read_yaml, require_writable
from logicrank.schemas.errors import JobFailed, UserError, validation_line

# options that were renamed or removed (CHANGELOG.md), by command, each with what replaced it: given, they are refused in
# one line saying so
_USE = "was replaced: use "
RENAMED = {
    "retrieve": {
        "--hybrid-depth": _USE + "--set hybrid/dense.k=N --set hybrid/bm25.k=N (or --k N: every run's depth, hybrid's fused lists too)",
        "--itlr-mode": _USE + "--set itlr.mode=exact|ann|listed",
        "--operators": _USE + "--set itlr.operators=and=product,or=sum,not=complement",
        "--calibration": _USE + "--set itlr.calibration=NAME (OrLog's: --set orlog.calibration=NAME)",
        "--labels": _USE + "--set itlr.labels=FILE",
        "--decompositions": _USE + "--set decomposition.decompositions=FILE (--method expansion: --set expansion.decompositions=FILE)",
        "--orlog-base": "was removed: write an orlog pipeline whose first stage is another retriever in a --pipelines file (docs/pipelines.md)",
        "--orlog-k": _USE + "--set orlog/bm25.k=N (the candidates OrLog reranks; --set reasoner/bm25.k=N the reasoner's)",
        "--orlog-calibration": _USE + "--set orlog.calibration=none|content-free|pool-mean",
        "--orlog-reasoner": _USE + "--set orlog.reasoner=compiled|problog",
        "--reasoner": _USE + "--set orlog.reasoner=compiled|problog",
        "--orlog-context": _USE + "--set orlog.context=true",
        "--no-orlog-context": _USE + "--set orlog.context=false",
    },
    "bench-setlogic": {"--orlog-depth": _USE + "--set orlog/bm25.k=N --set orlog-bm25/bm25.k=N"},
    "bench-rules": {"--r3": "was removed: R3 reranks after each retriever's best SIAR mode (--r3-n N: the rules it reorders)"},
}


class _Group(typer.core.TyperGroup):
    """The command group: an option of :data:`RENAMED` is refused in one line naming its
    replacement, where click would print the command's usage and "No such option"."""

    def invoke(self, ctx):
        with _renamed():
            return super().invoke(ctx)


@contextlib.contextmanager
def _renamed():
    try:
        yield
    except Exception as exc:  # click's NoSuchOption (typer vendors click from 0.25: matched by name, either way)
        command = exc.ctx.info_name if getattr(exc, "ctx", None) is not None else None
        said = RENAMED.get(command, {}).get(getattr(exc, "option_name", None)) if type(exc).__name__ == "NoSuchOption" else None
        if said is None:
            raise
        _fail(f"{command}: {exc.option_name} {said}")


app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, cls=_Group, help="logicrank: logic-aware retrieval at scale.")


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also show Ray's and vLLM's own log lines.")] = False,
    stall_timeout: Annotated[float, typer.Option(
        help="A job that makes no progress for this many seconds writes every thread's stack into its run directory and exits 1 "
             "(a rerun resumes); 0: never.", min=0)] = DEFAULT_TIMEOUT_S,
):
    """logicrank: logic-aware retrieval at scale."""
    global _stall_timeout
    from logicrank.jobs.raysession import VERBOSE_ENV

    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    _stall_timeout = stall_timeout
err = Console(stderr=True)
out = Console()

# the options of the commands that pass the encoder's backend and the cluster's address alone, from their fields
Backend = option(EmbedConfig, "backend", "backend").annotation
RayAddress = option(RayConfig, "ray_address", "address").annotation
Depth = Annotated[int | None, typer.Option(
    "--k", "--hits", min=1, max=10_000, help="Every run's depth (documents per query; Pyserini's --hits): the k of each pipeline's last "
    "stage that keeps a top k, a fusion's sub-pipelines' too; short for --set RUN/STAGE.k=N (docs/pipelines.md). A reranker's candidates "
    "stay as set (orlog: BM25's top 20), so its run is at most that deep.")]


LLM_ALL = LLM.at("llm")  # the LLM's options, setting the job config's llm
DECOMPOSE_LLM = LLM_ALL.aliased(llm_model="--model", llm_dtype="--dtype", llm_max_model_len="--max-model-len", llm_cache="--cache",
                                llm_batch_rows="--batch-rows")  # decompose's older names stay


def _run(fn, *args, **kwargs):
    """Run a job or build a config. A user error (:class:`UserError`, or a config value
    pydantic rejects) prints one line and exits 2; a job that failed for a reason outside its
    input (:class:`JobFailed`) prints one line and exits 1; a job interrupted (Ctrl-C, SIGTERM)
    that says what it left (jobs/index.py) prints that line and exits 130 (143 on SIGTERM);
    anything else is a bug and keeps its traceback."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return fn(*args, **kwargs)
    except UserError as exc:
        _fail(str(exc))
    except ValidationError as exc:
        _fail(validation_message(exc))
    except JobFailed as exc:
        _fail(str(exc), code=1)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM in a job that says what it left (jobs/index.py's IndexInterrupted)
        if str(exc) and isinstance(getattr(exc, "exit_code", None), int):
            _fail(str(exc), code=exc.exit_code)
        raise


_stall_timeout = DEFAULT_TIMEOUT_S  # the --stall-timeout of this invocation


def run_job(name: str, out: str | Path, fn, *args, **kwargs):
    """Run a long job under the stall watchdog (jobs/watchdog.py), which writes its stacks into
    ``out``; an ``out`` that cannot be written is refused first, in one line, before any work."""
    _run(require_writable, out, name, "--out")

    def watched():
        with watch(name, out, _stall_timeout):
            return fn(*args, **kwargs)

    return _run(watched)


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None


# config fields whose command-line option has another name
_OPTION_NAMES = {"methods": "method", "measures": "measure", "runs": "runs", "embed_actors": "actors", "embed_num_gpus": "gpus-per-actor",
                 "enforce_eager": "compiled", "candidates": "candidate"}


def validation_message(exc: ValidationError, flags: dict[str, str] | None = None) -> str:
    """A pydantic error as one line: each bad option (as its command-line flag: ``flags``, a
    field's path -> the flag the command spells it with, else the field's name), the value
    given, what it accepts (:func:`logicrank.schemas.errors.validation_line`)."""
    def option(loc: tuple) -> str:
        names = [x for x in loc if isinstance(x, str)]
        if not names:
            return ""
        return (flags or {}).get(".".join(names)) or "--" + _OPTION_NAMES.get(names[-1], names[-1]).replace("_", "-")

    return f"{exc.title.removesuffix('Config').lower()}: {validation_line(exc, name=option)}"


def config_message(exc: ValidationError, path: Path, model=None, typed: dict[str, str] | None = None) -> str:
    """A pydantic error about a config file as one line: each bad key by its place in the file;
    an unknown key lists the keys there are (``model``: the file's config class). ``typed``:
    the paths whose value came from the command line, not the file (path -> flag). Where one
    of those was refused, or the config as a whole (a rule over several fields), the line says
    both sources: a typed value by its flag, the file's by its key, a field neither gave by
    its name."""
    typed = typed or {}

    def dotted(loc: tuple) -> str:
        return ".".join(x for x in loc if isinstance(x, str))

    errors = exc.errors(include_url=False)
    if not typed or not any(dotted(e["loc"]) in typed or not e["loc"] for e in errors):
        return f"config {path}: {validation_line(exc, model)}"
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}

    def name(loc: tuple) -> str:
        if not loc or tuple(loc) in missing:
            return dotted(loc)
        return typed.get(dotted(loc)) or f"{path}'s {'.'.join(map(str, loc))}"

    return f"{exc.title.removesuffix('Config').lower()} (--config {path} and the command line): {validation_line(exc, model, name=name)}"


def _parts(bound: Bound) -> tuple[EmbedConfig, RayConfig, LLMConfig]:
    """The encoder, cluster and LLM configs of a command that passes them to its job alone."""
    return _config(EmbedConfig, bound, "embed"), _config(RayConfig, bound, "ray"), _config(LLMConfig, bound, "llm")


def _config(config, bound: Bound, part: str = "", **computed):
    """``config`` built from a command's bound options (logicrank/cli_config.py: the config's
    defaults < the command's < ``--config`` < the command line), ``part`` of it (``llm``)
    for a command that builds its sub-configs alone; ``computed``: fields the command works
    out itself. A bad value is one line (an option's name, or a key of the config file)."""
    data = _run(bound.data, part)
    data.update(computed)
    try:
        return config.model_validate(data)
    except ValidationError as exc:
        flags = bound.flags_under(part)
        if bound.file is None:
            _fail(validation_message(exc, flags))
        head = f"{part}." if part else ""
        _fail(config_message(exc, bound.file, config, {p: f for p, f in flags.items() if head + p in bound.given}))


_INDEX_FIELDS = ("table", "format", "delete_missing", "max_delete_fraction", "allow_mass_delete", "prune_after_hours",
                 "write_batch_rows", "writes", "bm25_workers", "max_reject_fraction", "max_doc_bytes", "ann_threshold", "tag", "ann", "rebuild_indexes",
                 "vector_column", "vector_model", "vector_dim")
_DB = Bind("db", default="data/lancedb")


@app.command()
@configured(EMBED.at("embed"), config=IndexConfig, file=True, corpus="corpus", db=_DB, title_sep="embed.title_sep",
            batch_size="embed.batch_size", actors="ray.embed_actors", gpus_per_actor="ray.embed_num_gpus", ray_address="ray.address",
            **{f: f for f in _INDEX_FIELDS})
def index(
    corpus: Annotated[str | None, typer.Argument(help="BEIR dir, JSONL(.gz), Parquet, TREC SGML or TSV file/dir; local path or pyarrow URI (or corpus: in --config).")] = None,
    out: Annotated[Path, typer.Option(help="Run directory (manifest, rejects).")] = Path("runs/index"),
    progress: Annotated[bool, typer.Option(help="Show a live progress line.")] = True,
    *,
    bound: Bound,
):
    """Embed a corpus into a LanceDB table, incrementally by content hash.

    Interrupted (Ctrl-C: exit 130; SIGTERM: 143), it says in one line what the table holds and
    how to resume; readers keep reading the last version a completed run finished."""
    from logicrank.jobs.index import run_index

    cfg = _config(IndexConfig, bound)
    _run(require_writable, cfg.db, "index", "--db")
    try:
        s = run_job("index", out, run_index, cfg, out, progress=progress)
    except KeyboardInterrupt:  # before the run locked the table (after, run_index's own line is printed by _run)
        _fail(f"index: interrupted before writing anything; table {cfg.table!r} is unchanged.", code=130)
    m = s.maintenance
    rebuilt = m.get("indexes_rebuilt") or []
    nothing = " (nothing changed)" if not (s.inserted or s.updated or s.deleted or rebuilt) else ""
    if s.resumed:
        since = f"v{s.since_version}, the last version a completed index run finished" if s.since_version is not None else "an empty table (no index run had completed)"
        v = s.resumed["from_version"]
        now = f"{s.precomputed} documents written" if cfg.vector_column is not None else f"{s.embedded} documents embedded"
        if s.resumed.get("kept_manifest"):  # the stopped run's manifest, under this --out, says it left that version
            start = f"finished the run that stopped at v{v} ({now} now); its manifest kept as {out / s.kept_manifest}"
        else:
            start = (f"started from v{v}, which the table does not mark complete (left by a run that stopped under another --out, "
                     f"restored from such a version, or written before logicrank marked complete runs; {now} now)")
        typer.echo(f"index: {start}; the counts below are of what changed since {since}.")
    elif s.kept_manifest:
        typer.echo(f"index: the manifest of the run that stopped before this one is kept as {out / s.kept_manifest}.")
    if note := reembed_note(cfg.table, s.embedded_by):
        typer.echo(note)
    if cfg.vector_column is not None:
        typer.echo(f"index: vectors from the corpus's {cfg.vector_column!r} ({cfg.vector_model}), none embedded: {s.precomputed} written.")
    if s.not_read:
        typer.echo(f"index: {len(s.not_read)} file(s) under the corpus directory not read, {s.why_not_read}, e.g. {s.not_read[0]}; "
                   "the run's manifest lists them.")
    if s.not_utf8:
        typer.echo(f"index: {s.not_utf8} TREC document(s) held bytes that are not UTF-8 (an older collection's Latin-1): indexed with "
                   "U+FFFD in their place, as Anserini and ir_datasets read them.")
    if s.held:
        one = s.held == 1
        typer.echo(f"index: {s.held} stored document{'' if one else 's'} kept as {'it was' if one else 'they were'}: "
                   f"{'its row' if one else 'their rows'} in this snapshot {'was' if one else 'were'} rejected (see "
                   f"{out / 'rejects.parquet'}); fix {'it' if one else 'them'} and rerun to update {'it' if one else 'them'}.")
    typer.echo(
        f"inserted {s.inserted}, updated {s.updated}, unchanged {s.unchanged}, deleted {s.deleted}, "
        f"rejected {s.rejected} {s.rejects_by_reason or ''}{nothing}; table {cfg.table!r} v{s.table_version} "
        f"({s.table_rows} rows), tag {s.tag}; maintenance: {m.get('fragments_removed', 0)} fragments compacted, "
        f"{m.get('versions_pruned', 0)} old versions pruned{', indexes rebuilt: ' + ', '.join(rebuilt) if rebuilt else ''}; "
        f"{s.seconds:.1f} s. Manifest: {out / 'manifest.json'}"
    )


@app.command()
def restore(
    version: Annotated[str, typer.Option(help="The version number or tag to bring back (see the index manifest).")],
    db: Annotated[str, typer.Option(help="LanceDB directory or URI.")] = "data/lancedb",
    table: str = "docs",
):
    """Make an earlier version of a table the latest one again (a new version; nothing is lost)."""
    from logicrank.pipelines.engines.store import DocStore
    from logicrank.pipelines.operations.writelock import TableLock

    store = _run(DocStore, db, table)
    if not _run(store.exists):
        _fail(f"restore: {store.absent()}; check --db and --table.")
    # a tag first (a tag may be all digits), else a version number
    target: int | str = int(version) if version.isdigit() and version not in store.table.tags.list() else version
    lock = TableLock(db, table, "restore")
    _run(lock.acquire)
    try:
        new = _run(store.restore, target)
    finally:
        lock.release()
    typer.echo(f"table {table!r} in {db!r}: version {target} restored as v{new} ({store.count()} rows).")
    if store.complete_version() not in (None, new):
        # (a version is known complete by a tag a completed run made; one whose tags were dropped since is not)
        typer.echo(f"restore: v{new} is not marked complete (version {target} holds no tag of a completed index run any more), so "
                   f"readers still read v{store.complete_version()} by default; read it with --table-version {new}, or run the index "
                   "job to make a complete version.")


@app.command()
def versions(
    db: Annotated[str, typer.Option(help="LanceDB directory or URI.")] = "data/lancedb",
    table: str = "docs",
):
    """List a table's versions, oldest first: when each was made, its rows, whether a completed index
    run finished it (complete, incomplete, or unrecorded where the table cannot tell; readers read
    the newest complete one by default) and its tags."""
    from logicrank.pipelines.engines.store import DocStore

    store = _run(DocStore, db, table)
    if not _run(store.exists):
        _fail(f"versions: {store.absent()}; check --db and --table.")
    rows = _run(store.version_rows)
    typer.echo(f"{'version':>7}  {'made':<27}  {'rows':>10}  {'state':<20}  tags")
    for r in rows:
        state = r["state"] + (", read" if r["read"] else "")
        typer.echo(f"{r['version']:>7}  {r['made']:<27}  {r['rows']:>10,}  {state:<20}  {', '.join(r['tags']) or '-'}".rstrip())
    if not any(r["read"] for r in rows):
        typer.echo(f"no version of table {table!r} was finished by a completed index run: readers refuse it (rerun logicrank index).")


@app.command()
@configured(EMBED.at("embed"), LLM_ALL, config=RetrieveConfig, file=True, queries="queries", db=_DB, table="table", table_version="table_version",
            trec="trec", topics_field="topics_field", on_parse_error="on_parse_error", retrieve_actors="ray.retrieve_actors",
            retrieve_batch_rows="ray.retrieve_batch_rows", shards="ray.retrieve_shards", ray_address="ray.address")
def retrieve(
    queries: Annotated[str | None, typer.Argument(help="BEIR queries.jsonl, JSONL, Parquet, qid<TAB>text .tsv or a TREC topics file "
                                                "(or queries: in --config).")] = None,
    pipelines: Annotated[
        Path | None, typer.Option(help="YAML file of named pipelines (docs/pipelines.md); replaces --method and its options.")
    ] = None,
    method: Annotated[list[str] | None, typer.Option(help="A preset pipeline (repeat): see `logicrank stages`. Default: dense.")] = None,
    run_tag: Annotated[str | None, typer.Option(help="Prefix of the presets' run ids.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="A stage option, STAGE.OPTION=VALUE (repeat; RUN/STAGE.OPTION=VALUE for one "
                                       "pipeline), e.g. orlog.k=20, itlr.scorer=bm25; `logicrank stages` lists every option.")
    ] = None,
    k: Depth = None,
    out: Path = Path("runs/retrieve"),
    progress: Annotated[bool, typer.Option(help="Print LLM progress.")] = True,
    *,
    bound: Bound,
):
    """Run named pipelines of stages (or --method presets); writes one run table per pipeline."""
    from logicrank.jobs.retrieve import run_retrieve
    from logicrank.pipelines.retrieval.overrides import parse_sets
    from logicrank.pipelines.retrieval.pipeline import pipelines_file, read_presets, with_sets

    # on_parse_error (the command line's or the config file's) replaces every stage's: a --set of a stage's own that differs
    # is refused, not overridden one way or the other
    if (policy := _run(bound.data).get("on_parse_error")) is not None:
        said = "--on-parse-error" if "on_parse_error" in bound.given else f"{bound.file}'s on_parse_error:"
        for key, value in _run(parse_sets, set_ or []).items():
            if key.rsplit(".", 1)[-1] == "on_parse_error" and value != policy:
                _fail(f"retrieve: {said} {policy} and --set {key}={value} disagree; give it once.")
    in_file = bound.file is not None and "pipelines" in _run(read_file, bound.file)
    if pipelines is not None or in_file:
        where = "--pipelines" if pipelines is not None else f"the pipelines of {bound.file}"
        if pipelines is not None and in_file:
            _fail(f"retrieve: --pipelines and {bound.file} both name pipelines; give them in one place.")
        if method or run_tag:
            _fail(f"retrieve: give {where} or --method (and --run-tag), not both (a pipelines file names its own pipelines).")
        cfg = _config(RetrieveConfig, bound, **({"pipelines": _run(pipelines_file, pipelines)} if pipelines is not None else {}))
        if set_ or k:
            cfg = _run(lambda: cfg.model_copy(update={"pipelines": with_sets(cfg.pipelines, set_, k)}))
    else:
        cfg = _config(RetrieveConfig, bound, pipelines=_run(read_presets, tuple(method or ["dense"]), run_tag, set_, k))
    for rid, path in run_job("retrieve", out, run_retrieve, cfg, out, echo=typer.echo, progress=progress).items():
        typer.echo(f"{rid}: {path}")


@app.command()
def stages():
    """The registered stages (what each consumes and needs, its options) and the --method presets."""
    from logicrank.pipelines.retrieval.pipeline import describe

    typer.echo(describe())


@app.command()
@configured(config=EvaluateConfig, file=True, qrels="qrels", runs=("runs", repeated), measure="measures", baseline="baseline", test="test",
            correction="correction", dedupe="dedupe", ignore_identical_ids="ignore_identical_ids", answers="answers", gold="gold", qa_measure="qa_measures",
            judge_llm=("judge.model", lambda v: v or None), name=("names", repeated))  # declared: the judge is optional, its model's default none
def evaluate(
    qrels: Annotated[str | None, typer.Argument(help="BEIR qrels TSV (or a BEIR dir), TREC qrels, Parquet or QUEST's examples (not needed for --answers alone).")] = None,
    runs: Annotated[list[str] | None, typer.Argument(help="Run tables (Parquet) or TREC run files.")] = None,
    judge_llm: Annotated[str | None, typer.Option(help="The LLM of the Judge measure (a registered name or a checkpoint dir); "
                                                  "the judge's other settings as --config gives them.")] = None,
    name: Annotated[list[str] | None, typer.Option(
        help="NEWID=FILE: evaluate the run in FILE (one of RUNS, or added to them) as run id NEWID, e.g. two files both tagged bm25; repeat.")] = None,
    out: Path = Path("runs/evaluate"),
    *,
    bound: Bound,
):
    """Evaluate runs (and answers): metrics table, significance tests, Markdown report and plot."""
    from logicrank.jobs.evaluate import evaluated_depths, evaluation_notes, run_evaluate
    from logicrank.pipelines.evaluation.measures import parse_measures
    from logicrank.pipelines.evaluation.qa import parse_qa_measures
    from logicrank.pipelines.evaluation.report import depth_cell, figure, summary_frame

    cfg = _config(EvaluateConfig, bound)
    _run(parse_measures, cfg.measures)
    if cfg.answers:
        _run(parse_qa_measures, cfg.qa_measures)
    metrics = run_job("evaluate", out, run_evaluate, cfg, out, echo=typer.echo)
    frame, depths = summary_frame(metrics), evaluated_depths(out)
    frame.insert(0, "depth", [depth_cell(depths, rid) for rid in frame.index])
    typer.echo(frame.to_string(float_format=figure, na_rep="-"))
    for line in evaluation_notes(out):
        typer.echo(line)
    typer.echo(f"report: {out / 'report.md'}")


@app.command()
@configured(DECOMPOSE_LLM, config=DecomposeConfig, file=True, queries="queries", method="methods", constrained="constrained",
            ray_address="ray.address")
def decompose(
    queries: Annotated[str | None, typer.Argument(help="BEIR queries.jsonl, JSONL or Parquet (or queries: in --config).")] = None,
    out: Path = Path("runs/decompose"),
    progress: bool = True,
    *,
    bound: Bound,
):
    """Decompose queries with an LLM: ITLR logical queries, OrLog atoms + form, reasoning expansions."""
    from logicrank.jobs.decompose import run_decompose

    cfg = _config(DecomposeConfig, bound)
    s = run_job("decompose", out, run_decompose, cfg, out, progress=progress, echo=typer.echo)
    note = " (unchanged: skipped)" if s.skipped else f", {s.prompts_run} prompts run, {s.cache_hits} from cache, {s.seconds:.1f} s"
    typer.echo(f"{s.rows} rows {s.by_status}{note}. Table: {s.path}")


@app.command("prepare-rulebench")
def prepare_rulebench(
    src: Annotated[Path | None, typer.Argument(help="A RuleBench set's directory as upstream publishes it (e.g. dataset/ulogic, dataset/deer).")] = None,
    out: Annotated[Path | None, typer.Option(help="Where the BEIR layout goes (default data/rulebench-<set>).")] = None,
    rules: Annotated[Path | None, typer.Option(help="The rule base, where the set names it otherwise than <split>_rule.json or rules.json.")] = None,
    queries: Annotated[Path | None, typer.Option(help="The query file, where the set names it otherwise than <split>_data.json.")] = None,
    split: Annotated[str, typer.Option(help="Which split's files to look for: test, validation, train.")] = "test",
    name: Annotated[str | None, typer.Option(help="The set's name in query ids (default: the directory's name).")] = None,
):
    """Convert a RuleBench set (rule retrieval; not bundled: no declared licence) to the BEIR layout, plus its gold outputs."""
    from logicrank.pipelines.datasets.rulebench import set_name, to_beir

    set_ = _run(set_name, src, queries, name)
    out = out or Path("data") / f"rulebench-{set_}"
    _run(require_writable, out, "prepare-rulebench", "--out")
    counts = _run(to_beir, src, out, rules, queries, split, name)
    answers = f", {counts['answers']} gold outputs" if counts["answers"] else f", no gold outputs ({counts['no_answers']})"
    typer.echo(f"{counts['rules']} rules ({counts['rules_file']}), {counts['queries']} queries ({counts['queries_file']}), "
               f"{counts['qrels']} qrels{answers} -> {out}")


@app.command("bench-rules")
@configured(EMBED.at("embed"), LLM_ALL, ray_address="ray.address")
def bench_rules(
    src: Annotated[str, typer.Argument(help="A RuleBench set's directory as upstream publishes it, or one `prepare-rulebench` wrote.")],
    out: Annotated[Path, typer.Option(help="Where the converted set, index, runs and report go.")] = Path("runs/rules"),
    rules: Annotated[Path | None, typer.Option(help="The rule base, where the set names it otherwise (see prepare-rulebench).")] = None,
    queries: Annotated[Path | None, typer.Option(help="The query file, where the set names it otherwise (see prepare-rulebench).")] = None,
    split: Annotated[str, typer.Option(help="Which split's files to look for: test, validation, train.")] = "test",
    sample: Annotated[int | None, typer.Option(help="Run this many queries, drawn with --seed (default: all).")] = None,
    seed: Annotated[int | None, typer.Option(help="The seed of --sample's draw (default 0).")] = None,
    r3_n: Annotated[int | None, typer.Option(help="R3: rules reordered per query (default: the file's, 20).", min=2, max=1000)] = None,
    vanilla: Annotated[bool, typer.Option(help="The vanilla rows only (rulebench-vanilla.yaml: no LLM).")] = False,
    reasoning: Annotated[bool, typer.Option(help="Then the reasoning table (rulebench-reasoning.yaml): answers with no rule, the gold "
                                                 "rules, the top-1 rule of vanilla, SIAR, SIAR + R3, scored against the set's outputs.")] = False,
    *,
    bound: Bound,
):
    """Rule retrieval on a RuleBench set (read from a path): vanilla, SIAR, SIAR + R3 (jobs/experiments/rulebench-siar.yaml), and reasoning with the retrieved rules."""
    from logicrank.pipelines.evaluation import benchmarks

    if seed is not None and sample is None:  # (as `experiment` refuses it: no draw to seed, the whole set runs)
        _fail(f"bench-rules: --seed {seed}: the seed of a sample; give --sample N too")
    where = {"rules": rules, "queries": queries, "split": split}
    exps = [_run(benchmarks.rules, src, sample, seed or 0, r3_n, vanilla=vanilla, **where)]
    if reasoning:
        exps.append(_run(benchmarks.reasoning, src, sample, seed or 0, **where))
    _experiments("bench-rules", exps, out, bound, nested=reasoning)


@app.command("prepare-qa")
def prepare_qa(
    name: Annotated[str, typer.Argument(help="musique | hotpotqa (bundled: 100 questions each).")],
    out: Annotated[Path | None, typer.Option(help="Where the BEIR layout and answers.jsonl go (default data/<name>).")] = None,
    src: Annotated[Path | None, typer.Option(help="Another question file of the same format instead of the bundled one.")] = None,
    corpus: Annotated[Path | None, typer.Option(help="MuSiQue: the paragraph corpus file going with --src (default: its questions' paragraphs).")] = None,
):
    """Write a bundled multi-hop QA set (MuSiQue, HotpotQA) as BEIR (corpus, queries, qrels of gold paragraphs) plus answers.jsonl."""
    from logicrank.pipelines.datasets.qa import to_beir

    out = out or Path("data") / name
    _run(require_writable, out, "prepare-qa", "--out")
    counts = _run(to_beir, name, out, src, corpus)
    typer.echo(f"{counts['docs']} paragraphs, {counts['queries']} questions, {counts['qrels']} gold paragraphs -> {out}")


@app.command("bench-lag")
@configured(EMBED.at("embed"), LLM_ALL, ray_address="ray.address")
def bench_lag(
    name: Annotated[str, typer.Argument(help="musique (oracle table + LLM rows) | hotpotqa (LLM rows).")] = "musique",
    out: Annotated[Path | None, typer.Option(help="Where the set, index, runs and reports go (default runs/lag-<name>).")] = None,
    src: Annotated[Path | None, typer.Option(help="The set's question file instead of the bundled one: a JSON array or JSON Lines, "
                                             "gzip or not, as `prepare-qa --src` reads it.")] = None,
    corpus: Annotated[Path | None, typer.Option(help="MuSiQue: the paragraph corpus file going with --src (default: its questions' paragraphs).")] = None,
    sample: Annotated[int | None, typer.Option(help="LLM rows on this many questions, drawn with --seed (default: all).")] = None,
    seed: int = 0,
    llm_rows: Annotated[bool, typer.Option(help="Run RAG, LAG and the ablations with the LLM (--no-llm-rows: the oracle table only).")] = True,
    judge: Annotated[bool, typer.Option(help="Add the LLM-judge accuracy (the same LLM judges).")] = False,
    *,
    bound: Bound,
):
    """LAG on a multi-hop set (bundled, or --src): the LLM-free oracle (MuSiQue), then RAG vs LAG and its ablations; jobs/experiments/lag*.yaml."""
    from logicrank.pipelines.datasets.qa import SETS
    from logicrank.pipelines.evaluation import benchmarks

    if name not in SETS:
        _fail(f"bench-lag: unknown set {name!r}; valid: {', '.join(SETS)}")
    if name == "hotpotqa" and not llm_rows:
        _fail("bench-lag: hotpotqa has no gold decompositions, so no oracle table; drop --no-llm-rows.")
    _experiments("bench-lag", _run(benchmarks.lag, name, sample, seed, judge, llm_rows, src=src, corpus=corpus),
                 out or Path(f"runs/lag-{name}"), bound, nested=True)


generate_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Dataset generation: logical benchmarks from a corpus, with labels.")
app.add_typer(generate_app, name="generate")


_GENERATE_FIELDS = ("table", "docs", "shard_docs", "questions_per_shard", "max_topics", "seed", "candidate_k", "dedup_threshold",
                    "label_threshold", "wave_shards")


@generate_app.command("itlr")
@configured(EMBED.at("embed"), LLM_ALL, config=GenerateConfig, file=True, db="db", candidate="candidates", ray_address="ray.address",
            **{f: f for f in _GENERATE_FIELDS})
def generate_itlr(
    out: Annotated[Path, typer.Option(help="The dataset's directory (checkpoints too: rerun the same command to resume).")],
    progress: Annotated[bool, typer.Option(help="Print LLM progress.")] = False,
    *,
    bound: Bound,
):
    """ITLR's real-corpus recipe: topics -> 32 templates -> questions -> candidates -> LLM labels (BEIR layout + dataset card)."""
    from logicrank.jobs.generate import DEMO_NOTE, run_generate
    cfg = _config(GenerateConfig, bound)
    if cfg.demo_note is None and "smollm2" in cfg.llm.model.lower():
        cfg = cfg.model_copy(update={"demo_note": DEMO_NOTE})
    run_job("generate", out, run_generate, cfg, out, echo=typer.echo, progress=progress)
    typer.echo(f"card: {out / 'card.md'}")


@generate_app.command("setlogic")
def generate_setlogic(
    out: Annotated[Path, typer.Option(help="Where the BEIR layout, gold decompositions and generation.json go.")] = Path("data/setlogic"),
    per_template: Annotated[int, typer.Option(help="Queries per QUEST template (7 templates).")] = 20,
    seed: int = 0,
    src: Annotated[Path | None, typer.Option(help="A LIMIT-shaped directory (corpus, queries, qrels JSONL) instead of the bundled LIMIT-small.")] = None,
):
    """QUEST-style set-logic queries over LIMIT's like-lists, with exact gold sets (no LLM)."""
    from logicrank.pipelines.generate.setlogic import generate

    _run(require_writable, out, "generate setlogic", "--out")
    c = _run(generate, out, per_template, seed, src)
    typer.echo(f"{c['queries']} queries, {c['qrels']} gold pairs over {c['people']} people -> {out}")


@app.command("bench-setlogic")
@configured(EMBED.at("embed"), LLM_ALL, ray_address="ray.address")
def bench_setlogic(
    out: Annotated[Path, typer.Option(help="Where the set, index, runs and report go.")] = Path("runs/setlogic"),
    per_template: Annotated[int, typer.Option(help="Queries per QUEST template (7 templates).")] = 20,
    seed: int = 0,
    k: Annotated[int, typer.Option(min=1, help="Depth of R@k and F1@k (the predicted set).")] = 5,
    orlog: Annotated[bool, typer.Option(help="Add OrLog with the gold atoms (LLM scoring; --no-orlog: dense, bm25, ITLR only).")] = True,
    set_: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE (repeat), as `logicrank experiment --set`: e.g. "
                                                  "orlog/bm25.k=50 --set orlog-bm25/bm25.k=50 (both OrLog rows over BM25's top 50: the same candidates), orlog.context_tokens=128.")] = None,
    *,
    bound: Bound,
):
    """Set-logic queries over LIMIT with exact gold: dense, bm25, ITLR (gold form), OrLog (gold atoms), by template; jobs/experiments/setlogic.yaml."""
    from logicrank.pipelines.evaluation import benchmarks

    _experiments("bench-setlogic", [_run(benchmarks.setlogic, per_template, seed, k, orlog, set_)], out, bound)


models_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="LLM checkpoints that ship inside packages.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list():
    """Registered models: installed (every part), prepared (a checkpoint in the cache), and their sizes."""
    from logicrank.pipelines.llm.models import MARKER, REGISTRY, installed, prepared_dir

    for name, spec in REGISTRY.items():
        target = prepared_dir(name)
        source = f"{spec.size / 2**20:,.0f} MiB" if spec.size else ""
        if (target / MARKER).is_file():
            on_disk = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
            state = f"prepared ({on_disk / 2**20:,.0f} MiB in {target})"
        else:
            state = "not prepared (`logicrank models prepare NAME`, or on first use)"
        packages = spec.parts[0].package if len(spec.parts) == 1 else f"{spec.parts[0].package} ... {spec.parts[-1].package}"
        where = f"installed: {packages}{f', {source}' if source else ''}" if installed(name) else f"not installed ({packages}: `{spec.install}`)"
        typer.echo(f"{name}: {where}; {state}. {spec.note}")


@models_app.command("prepare")
def models_prepare(
    name: Annotated[str, typer.Argument(help="A registered model.")] = "smollm2-135m-instruct",
    force: Annotated[bool, typer.Option(help="Rebuild even when the checkpoint checks out.")] = False,
):
    """Turn a packaged model into a local checkpoint (idempotent; verified by checksum)."""
    from logicrank.pipelines.llm.models import prepare

    r = _run(prepare, name, force=force, log=typer.echo)
    typer.echo(f"{r.model_id}: {r.path}")


datasets_app = typer.Typer(rich_markup_mode=None, help="Datasets by name: the bundled ones and those you register.")
app.add_typer(datasets_app, name="datasets")


@datasets_app.callback(invoke_without_command=True)
def datasets_list(ctx: typer.Context):
    """List the bundled datasets and the ones you registered (`logicrank datasets add`); an
    experiment names any of them (`dataset: NAME`), or `irds:<id>` for ir_datasets' cache."""
    if ctx.invoked_subcommand is not None:
        return
    from logicrank.pipelines.datasets import registry

    typer.echo("bundled:")
    for name, (what, _) in registry.BUNDLED.items():
        typer.echo(f"  {name}: {what}")
    held = _run(registry.registered)
    typer.echo(f"registered ({registry.registry_path()}):" + ("" if held else " none; add one with `logicrank datasets add`"))
    for name, entry in held.items():
        typer.echo(f"  {name}: corpus {entry.corpus} ({entry.format}), queries {entry.queries}, qrels {entry.qrels}"
                   + (f"; {entry.description}" if entry.description else ""))
    typer.echo("ir_datasets: irds:<id>, read from the local ir_datasets cache (nothing is downloaded)")


@datasets_app.command("add")
def datasets_add(
    name: Annotated[str, typer.Argument(help="The name experiments give it by (dataset: NAME).")],
    corpus: Annotated[str, typer.Option(help="The corpus file or directory: BEIR, JSONL, Parquet, TREC SGML or TSV.")],
    queries: Annotated[str, typer.Option(help="The queries: BEIR queries.jsonl, JSONL, Parquet, TSV or a TREC topics file.")],
    qrels: Annotated[str, typer.Option(help="The qrels: BEIR TSV or TREC qrels.")],
    format: Annotated[str, typer.Option(help="The corpus format: auto, beir, jsonl, parquet, trec or tsv.")] = "auto",
    topics_field: Annotated[str, typer.Option(help="A TREC topics file's field that is the query: title, desc or narr.")] = "title",
    description: Annotated[str, typer.Option(help="A line saying what it is.")] = "",
    replace: Annotated[bool, typer.Option(help="Overwrite a dataset of that name.")] = False,
):
    """Register a collection by name (its paths stored absolute)."""
    from logicrank.pipelines.datasets import registry

    entry = _run(registry.Registered, corpus=corpus, queries=queries, qrels=qrels, format=format, topics_field=topics_field,
                 description=description)
    path = _run(registry.register, name, entry, replace=replace)
    typer.echo(f"registered {name} in {path}")


@datasets_app.command("remove")
def datasets_remove(name: Annotated[str, typer.Argument(help="A registered dataset.")]):
    """Forget a registered dataset (its files stay where they are)."""
    from logicrank.pipelines.datasets import registry

    path = _run(registry.unregister, name)
    typer.echo(f"removed {name} from {path}")


@app.command("bench-itlr")
@configured(EMBED.at("embed"), ray_address="ray.address")
def bench_itlr(
    out: Annotated[Path, typer.Option(help="Where the generated set, index, runs and reports go.")] = Path("runs/itlr"),
    per_template: Annotated[int, typer.Option(help="Queries per template (32 templates).")] = 10,
    seed: int = 0,
    operators: Annotated[bool, typer.Option(help="Add every operator family (Table 2; --no-operators: Table 1's runs only).")] = True,
    *,
    bound: Bound,
):
    """ITLR's synthetic logical benchmark from SciFact text, pooled and own settings: Table 1 (by negations) and Table 2 (operators); jobs/experiments/itlr-synthetic*.yaml."""
    from logicrank.pipelines.evaluation import benchmarks

    _experiments("bench-itlr", _run(benchmarks.itlr, per_template, seed, operators), out, bound, nested=True)


app.command("itlr-bench", hidden=True, help="Old name of bench-itlr.")(bench_itlr)


@app.command()
@configured(EMBED.at("embed"))
def ablate(
    queries: Annotated[str, typer.Argument(help="Queries with a logical_query column.")],
    qrels: str,
    db: str = "data/lancedb",
    table: str = _d(IndexConfig, "table"),
    measure: str = "nDCG@10",
    out: Path = Path("runs/ablate"),
    scorer: Annotated[str, typer.Option(help="Term evidence: dense (cosines), bm25 or hybrid.")] = "dense",
    calibration: Annotated[str | None, typer.Option(help="Term-score calibration (default: the scorer's; dense none, bm25 max): none, zscore, max, saturation.")] = None,
    hybrid_weight: Annotated[float, typer.Option(help="hybrid: the share of calibrated BM25 evidence.", min=0.0, max=1.0)] = 0.5,
    empty_not: Annotated[str, typer.Option(help="A NOT over a term no document holds: refuse (one line), or hold (it holds for every "
                                                "document), as the itlr stage's empty_not.")] = "refuse",
    *,
    bound: Bound,
):
    """ITLR operator ablation for one term scorer: every AND x OR x NOT family, one exact pass, one table."""
    from logicrank.jobs.ablate import run_ablate

    if empty_not not in ("refuse", "hold"):
        raise typer.BadParameter(f"--empty-not {empty_not!r}: give refuse or hold")
    df = run_job("ablate", out, run_ablate, queries, qrels, db, out, _config(EmbedConfig, bound, "embed"), table, measure, 100, scorer,
              calibration, hybrid_weight, typer.echo, empty_not)
    typer.echo(df.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


@app.command()
def nightly(
    config: Annotated[Path, typer.Argument(help="The nightly config (YAML; docs/operations.md). Relative paths in it are from the working directory.")],
    date: Annotated[str | None, typer.Option(help="The night, YYYY-MM-DD (default today, UTC); rerunning a night finishes it.")] = None,
    at: Annotated[
        str | None, typer.Option(help="Time travel: only evaluate the pipelines against this table version or tag (e.g. nightly-2026-11-20); no index, history or alert.")
    ] = None,
    ray_address: RayAddress = None,
    progress: Annotated[bool, typer.Option(help="Show the index job's live counter and LLM progress.")] = False,
    promote_on_regression: Annotated[bool | None, typer.Option(
        "--promote-on-regression/--hold-on-regression",
        help="Move the served tag to a night that regressed too (default: the config's promote_on_regression, false: the tag "
             "stays on the last good version).")] = None,
):
    """One night: re-index, maintain, evaluate, compare with the previous night, serve, alert.

    A regression holds the served tag on the last good version (the alert says so) unless
    --promote-on-regression (or promote_on_regression: true in the config).
    Exit codes: 0 the night finished without regression; 3 a measure regressed (alert written);
    4 the night stopped before evaluation (re-index refused; the served tag did not move);
    2 a bad config or input; 1 a crash (alert written; rerun the night to finish it)."""
    from logicrank.jobs.nightly import run_at, run_nightly
    from logicrank.pipelines.config.retrieval import NightlyConfig

    if at is not None and date is not None:
        _fail("nightly: --at evaluates one table version and --date names a night to run; give one of them.")
    data = _run(_read_config, config)
    if ray_address:
        put(data, "index.ray.address", ray_address)  # (an empty ``index:`` or ``ray: null`` reads as no settings)
    if promote_on_regression is not None:  # given: it overrides the config file's
        data["promote_on_regression"] = promote_on_regression
    try:
        cfg = NightlyConfig.model_validate(data)
    except ValidationError as exc:
        _fail(config_message(exc, config, NightlyConfig))
    _run(require_writable, cfg.out, "nightly", f"out (in {config})")
    if at is not None:
        from logicrank.jobs.evaluate import evaluated_depths
        from logicrank.pipelines.evaluation.report import depth_cell, figure, summary_frame

        for qs, metrics in run_job("nightly", cfg.out, run_at, cfg, at, echo=typer.echo, progress=progress).items():
            typer.echo(f"{qs} at table version {at}:")
            frame, depths = summary_frame(metrics), evaluated_depths(Path(cfg.out) / "at" / at / "sets" / qs / "evaluate")  # (run_at's)
            frame.insert(0, "depth", [depth_cell(depths, rid) for rid in frame.index])
            typer.echo(frame.to_string(float_format=figure, na_rep="-"))
        return
    _run(require_writable, cfg.index.db, "nightly", f"index.db (in {config})")  # (--at only reads the table)
    result = run_job("nightly", cfg.out, run_nightly, cfg, date, echo=typer.echo, progress=progress)
    alert = f"; alert {result.alert}" if result.alert else ""
    typer.echo(f"night {result.date}: {result.status}{_held(result.served)}{alert}; report {result.report or '(none: the night stopped)'}")
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@app.command("nightly-demo")
def nightly_demo(
    out: Annotated[Path, typer.Option(help="Where the snapshots, the table and the nightly directory go (emptied first).")] = Path("runs/nightly-demo"),
    corrupt_queries: Annotated[int, typer.Option(min=1, help="Night 3 swaps the texts of the relevant documents of this many queries.")] = 60,
    backend: Backend = _d(EmbedConfig, "backend"),
    ray_address: RayAddress = None,
):
    """Three nights of `logicrank nightly` on bundled SciFact: baseline, a routine change, a corrupted snapshot."""
    from logicrank.jobs.nightly_demo import run_demo

    results = run_job("nightly-demo", out, run_demo, out, corrupt_queries, echo=typer.echo, backend=backend, address=ray_address)
    for r in results:
        typer.echo(f"night {r.date}: {r.status} (exit code {r.exit_code}){_held(r.served)}" + (f", alert {r.alert}" if r.alert else ""))
    typer.echo(f"config: {out / 'nightly.yaml'}; report: {out / 'nightly' / 'report.md'}")
    if [r.status for r in results] != ["ok", "ok", "regression"]:
        _fail("nightly-demo: expected no alert on nights 1 and 2 and a regression on night 3; see the report.")
    if not results[2].served.get("held") or results[2].served.get("version") != results[1].served.get("version"):
        _fail(f"nightly-demo: expected night 3's regression to hold the served tag on night 2's version; it reads {results[2].served}.")


def _held(served: dict | None) -> str:
    """', served tag 'served' held on v12' for a night whose regression held the tag."""
    if not served or not served.get("held"):
        return ""
    where = f"held on v{served['version']}" if served.get("version") is not None else "left unset"
    return f", served tag {served['tag']!r} {where} (tonight's v{served['tonight']} not served)"


def _read_config(path: Path) -> dict:
    """A YAML config file's top-level mapping."""
    data = read_yaml(path, "config", UserError)
    if not isinstance(data, dict):
        raise UserError(f"config {path}: expected a mapping (out, index, query_sets, pipelines, ...).")
    return data


@app.command()
@configured(EMBED.at("embed"), LLM_ALL, ray_address="ray.address")
def experiment(
    file: Annotated[Path, typer.Argument(help="An experiment file (docs/experiments.md; shipped ones in jobs/experiments/).")],
    out: Annotated[Path | None, typer.Option(help="Where the index, runs and report go; default runs/experiments/<name>.")] = None,
    sample: Annotated[int | None, typer.Option(help="Run this many of the dataset's queries, drawn with --seed (overrides the file's dataset.sample or query_ids).")] = None,
    seed: Annotated[int | None, typer.Option(help="The sample's seed (overrides the file's dataset.seed).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE (repeat), the value read as YAML: a stage option by the "
                                                  "stage's name (orlog.k=20; RUN/STAGE.OPTION for one pipeline) or a dotted key of the file "
                                                  "(dataset.sample=25).")] = None,
    k: Depth = None,
    progress: bool = True,
    *,
    bound: Bound,
):
    """Run an experiment: index its dataset, run its pipelines, evaluate, check its reference figures, write one report."""
    from logicrank.pipelines.evaluation.experiment import load, override, with_sample
    from logicrank.pipelines.retrieval.overrides import is_stage_key, parse_sets, with_depth
    from logicrank.pipelines.retrieval.pipeline import with_sets

    exp = _run(load, file)
    if set_ or k:
        def overridden():
            runs, given = exp.pipelines_to_run(), parse_sets(set_)
            if k:  # --k's mistakes in retrieve's words (with_sets names --k N); the file's other keys are override's
                with_sets(runs, {key: v for key, v in given.items() if is_stage_key(key, runs)}, k)
            return override(exp, with_depth(given, runs, k))
        exp = _run(overridden)
    if seed is not None and sample is None and exp.dataset.sample is None:
        _fail(f"--seed {seed}: the seed of a sample, and neither --sample nor the file's dataset.sample draws one; give --sample N too")
    if sample is not None or seed is not None:
        exp = _run(with_sample, exp, sample, seed)
    _experiments("experiment", [exp], out or Path("runs/experiments") / exp.name, bound, progress)


def _experiments(job: str, exps: list, out: Path, bound: Bound, progress: bool = True, nested: bool = False) -> None:
    """Run experiments and print each run's figures, the references and the report's path;
    they share one index (``out``), and with ``nested`` each writes under ``out/<name>``. A
    missed reference exits 1 after every report is written."""
    from logicrank.jobs.experiment import run_experiment
    from logicrank.pipelines.evaluation.experiment import override
    from logicrank.pipelines.evaluation.report import depth_cell, figure

    embed, ray, llm = _parts(bound)
    # an encoder option given on the command line beats the file's embed where the two differ (a change of encoder: the
    # references are left unchecked); where the file sets none, the option reaches the index through ``embed`` as before
    given = {path.partition(".")[2]: bound.values[path] for path in sorted(bound.given) if path.startswith("embed.")}
    missed = []
    for exp in exps:
        if changed := {f"embed.{k}": v for k, v in given.items() if k in exp.embed and exp.embed[k] != v}:
            exp = _run(override, exp, changed)
        where = out / exp.name if nested else out
        result = run_job(job, out, run_experiment, exp, where, embed, ray, llm, strict=False, progress=progress, echo=typer.echo, index_dir=out)
        for rid, row in result.summary.iterrows():
            typer.echo(f"{rid}: depth {depth_cell(result.depths, rid)}  " + "  ".join(f"{m} {figure(v)}" for m, v in row.items()))
        for c in result.checks:
            got = figure(c.got)
            typer.echo(f"reference {c.reference.run} {c.reference.measure}: {got} vs {c.reference.value} ± {c.reference.tolerance}: "
                       + ("reproduced" if c.ok else "MISSED"))
            missed += [] if c.ok else [f"{exp.name} {c.reference.run} {c.reference.measure}"]
        typer.echo(f"report: {result.report}")
    if missed:
        _fail(f"{job}: {len(missed)} reference figure(s) missed: {', '.join(missed)} (see the report)", code=1)


@app.command("main")
def main_job(
    out: Annotated[Path, typer.Option(help="Where the index, runs and report go.")] = Path("runs/scifact"),
    backend: Backend = _d(EmbedConfig, "backend"),
    ray_address: RayAddress = None,
    progress: bool = True,
    rulebench: Annotated[
        str | None, typer.Option(envvar="LOGICRANK_RULEBENCH", help="RuleBench ULogic's directory (not bundled) for the rules section; unset: skipped.")
    ] = None,
):
    """The main job on embedded defaults: index bundled SciFact, dense/BM25/hybrid, evaluate."""
    from logicrank.jobs.main_job import run_main

    result = run_job("main", out, run_main, out, _run(EmbedConfig, backend=backend), _run(RayConfig, address=ray_address), progress=progress, echo=typer.echo,
                  rulebench=rulebench)
    if not result["reproduced"]:
        raise typer.Exit(1)


def reembed_note(table: str, embedded_by: dict) -> str | None:
    """The index job's line on the stored documents it wrote again because what made the
    table's vectors changed (``embedded_by``: the summary's before, now, reembedded); None
    when it wrote none again. A record is the embedding code's digest, or ``precomputed`` for
    the corpus's own vectors, either followed by ``+`` and a local model directory's files."""
    n = embedded_by.get("reembedded")
    if not n:
        return None
    given = {k: (embedded_by.get(k) or "").partition("+")[0] == "precomputed" for k in ("before", "now")}
    if given["before"] != given["now"]:
        how = {True: "given by the corpus (--vector-column)", False: "embedded by logicrank"}
        return (f"index: table {table!r}'s vectors were {how[given['before']]}; this run's are {how[given['now']]}, so its {n} stored "
                "documents were written again.")
    if given["now"]:
        return (f"index: table {table!r}'s vectors were given by the corpus for another --vector-model, or for its files as they were then: "
                f"its {n} stored documents were written again with this run's vectors.")
    return (f"index: the code that embeds documents (pipelines/engines/embed.py and what it imports) changed since table {table!r}'s "
            f"vectors were made ({embedded_by['before']} -> {embedded_by['now']}): its {n} stored documents were embedded again.")


if __name__ == "__main__":
    app()

