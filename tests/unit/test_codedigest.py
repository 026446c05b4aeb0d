"""Cache keys from the code (pipelines/codedigest.py): a stage's key covers the source of its
module and of every project module it imports, so an edit to a method recomputes that method
and what comes after it, and nothing else. No Ray: a copy of the project's Python files is
edited and digested in fresh processes, and pipelines run in process with stand-ins."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from logicrank.pipelines.codedigest import PROJECT, closure, code_digest

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["logicrank.pipelines.retrieval.stages.itlr", "logicrank.pipelines.retrieval.stages.retrievers", "logicrank.pipelines.retrieval.stages.orlog", "logicrank.pipelines.retrieval.runner", "logicrank.jobs.retrieve", "logicrank.jobs.index"]
DIGEST = "import json, sys; from logicrank.pipelines.codedigest import code_digest; import logicrank.pipelines; print(json.dumps([logicrank.pipelines.__file__, {m: code_digest(m) for m in sys.argv[1:]}]))"


def _copy(tmp_path: Path) -> Path:
    """The project's Python files (its four folders), nothing else, with the package
    configuration's mapping (``logicrank.pipelines`` is the folder pipelines/) as links, so a
    process run in the copy imports the copy's code."""
    dst = tmp_path / "copy"
    for folder in ("logicrank", "pipelines", "jobs", "schemas"):
        shutil.copytree(ROOT / folder, dst / folder, ignore=lambda d, names: [n for n in names if n == "__pycache__" or not (n.endswith(".py") or (Path(d) / n).is_dir())])
    for folder in ("pipelines", "jobs", "schemas"):
        (dst / "logicrank" / folder).symlink_to(Path("..") / folder, target_is_directory=True)
    return dst


def _digests(copy: Path, code: str = DIGEST, modules=MODULES) -> dict[str, str]:
    """The digests a fresh process computes in the copy (its packages imported from there)."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    out = subprocess.run([sys.executable, "-c", code, *modules], cwd=copy, env=env, capture_output=True, text=True, check=True)
    where, digests = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(where).resolve() == (copy / "pipelines" / "__init__.py").resolve()  # the copy's code, not this checkout's
    return digests


def _changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {m for m in before if before[m] != after[m]}


def test_an_edit_changes_the_digest_of_the_stages_that_import_it_and_no_other(tmp_path):
    copy = _copy(tmp_path)
    first = _digests(copy)
    assert first == {m: code_digest(m) for m in MODULES}  # the copy is this code: the same digests from another directory
    assert _digests(copy) == first  # stable

    itlr = copy / "pipelines" / "retrieval" / "methods" / "itlr.py"
    itlr.write_text(itlr.read_text() + "\n# a harmless edit\n")
    edited = _digests(copy)
    # ITLR's stage and OrLog's (its stage imports ITLR's evidence) and the retrieve job, which runs every stage
    assert _changed(first, edited) == {"logicrank.pipelines.retrieval.stages.itlr", "logicrank.pipelines.retrieval.stages.orlog", "logicrank.jobs.retrieve"}

    unused = copy / "pipelines" / "evaluation" / "significance.py"  # no stage imports it
    unused.write_text(unused.read_text() + "\n# an edit no stage sees\n")
    assert _digests(copy) == edited

    base = copy / "pipelines" / "retrieval" / "stages" / "base.py"  # every stage's contract
    base.write_text(base.read_text() + "\n# an edit every stage sees\n")
    assert _changed(edited, _digests(copy)) == set(MODULES) - {"logicrank.jobs.index"}


def test_the_digest_is_computed_once_per_process(tmp_path):
    copy = _copy(tmp_path)
    code = ("import json, sys, pathlib; from logicrank.pipelines.codedigest import code_digest; import logicrank.pipelines; m = 'logicrank.pipelines.retrieval.stages.itlr'; "
            "a = code_digest(m); p = pathlib.Path('pipelines/retrieval/methods/itlr.py'); p.write_text(p.read_text() + '# edited\\n'); "
            "print(json.dumps([logicrank.pipelines.__file__, {'first': a, 'again': code_digest(m)}]))")
    once = _digests(copy, code, [])
    assert once["first"] == once["again"] == code_digest("logicrank.pipelines.retrieval.stages.itlr")  # the edit is not seen by this process
    assert _digests(copy, DIGEST, ["logicrank.pipelines.retrieval.stages.itlr"])["logicrank.pipelines.retrieval.stages.itlr"] != once["first"]  # the next one sees it


def test_a_source_digest_is_of_the_modules_own_source(tmp_path):
    from logicrank.pipelines.codedigest import source_digest

    assert source_digest("logicrank.jobs.retrieve") == hashlib.sha256((ROOT / "jobs" / "retrieve.py").read_bytes()).hexdigest()[:16]
    assert source_digest("logicrank.no_such_module") == hashlib.sha256(b"").hexdigest()[:16]


def test_the_closure_follows_import_statements_not_the_packages_python_runs_first():
    bm25, itlr = closure("logicrank.pipelines.retrieval.stages.retrievers"), closure("logicrank.pipelines.retrieval.stages.itlr")
    assert bm25[0] == "logicrank.pipelines.retrieval.stages.retrievers" and itlr[0] == "logicrank.pipelines.retrieval.stages.itlr"
    assert "logicrank.pipelines.retrieval.methods.itlr" in itlr and "logicrank.pipelines.retrieval.methods.itlr" not in bm25
    assert {"logicrank.pipelines.retrieval.methods.bm25", "logicrank.pipelines.retrieval.methods.dense", "logicrank.pipelines.retrieval.stages.base", "logicrank.pipelines.codedigest"} <= set(bm25)
    assert "logicrank.pipelines.io" in bm25  # imported inside a function (stages import lazily)
    assert "logicrank.pipelines.retrieval.stages" not in bm25  # `from logicrank.pipelines.retrieval.stages.base import Stage` does not cover the package's __init__ ...
    assert "logicrank.pipelines.retrieval.stages" in closure("logicrank.jobs.retrieve")  # ... `from logicrank.pipelines.retrieval.stages import Context` does (and every stage it imports)
    assert "logicrank.pipelines.retrieval.stages.itlr" in closure("logicrank.jobs.retrieve")
    assert all(m.split(".")[0] in PROJECT for m in itlr)  # third-party code is not hashed



def test_the_closure_follows_relative_imports_as_python_resolves_them(tmp_path):
    copy = _copy(tmp_path)
    probe = "logicrank.pipelines.retrieval.stages.relative_probe"
    (copy / "pipelines" / "retrieval" / "stages" / "relative_probe.py").write_text(
        "from .base import Stage\nfrom ..methods import itlr\nfrom ... import files\n\n\ndef never_run():\n    from ..... import beyond_the_top\n")
    code = ("import json, sys; from logicrank.pipelines.codedigest import closure; import logicrank.pipelines; "
            "print(json.dumps([logicrank.pipelines.__file__, {m: closure(m) for m in sys.argv[1:]}]))")
    got = _digests(copy, code, [probe])[probe]
    assert got[0] == probe
    assert {"logicrank.pipelines.retrieval.stages.base", "logicrank.pipelines.retrieval.methods.itlr", "logicrank.pipelines.files"} <= set(got)
    assert all(m.split(".")[0] in PROJECT for m in got)  # the import beyond the top package names nothing


# -- the runner: an edit to ITLR's code recomputes ITLR, and reuses dense -------------------------------------

DIM = 8


def _vector(text: str) -> np.ndarray:
    v = np.random.default_rng(abs(hash(text)) % 2**32).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


class _Store:
    """Twenty documents with fixed vectors, at version 1: what dense and ITLR (listed) read."""

    uri, name, version, dim = "stand-in", "docs", 1, DIM

    def __init__(self):
        rng = np.random.default_rng(0)
        m = rng.normal(size=(20, DIM)).astype(np.float32)
        self.ids = np.array([f"d{i:02d}" for i in range(20)], dtype=object)
        self.matrix = m / np.linalg.norm(m, axis=1, keepdims=True)

    def count(self):
        return len(self.ids)

    def has_ann_index(self):
        return False

    def vectors(self, precision="float32"):
        from logicrank.pipelines.engines.vectors import Vectors, tiebreak_ranks

        ids = pa.array(self.ids.tolist(), pa.string())
        return Vectors(ids, self.matrix.astype(precision), tiebreak_ranks(ids))

    def vectors_for(self, doc_ids):
        where = {d: i for i, d in enumerate(self.ids)}
        return {d: self.matrix[where[d]] for d in doc_ids if d in where}


class _Encoder:
    config, model_id = None, "stand-in"

    def encode(self, texts):
        return np.stack([_vector(t) for t in texts])


def test_an_edit_to_itlrs_code_recomputes_itlr_and_reuses_dense(tmp_path, monkeypatch):
    import logicrank.pipelines.codedigest
    from logicrank.pipelines.retrieval.pipeline import Pipeline
    from logicrank.pipelines.retrieval.runner import Inputs, StageCache
    from logicrank.pipelines.retrieval.stages import Context

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{q}\td{d:02d}\t1\n" for q in (1, 2) for d in range(0, 20, 3)))
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["alpha", "beta"], "logical_query": ['"a" AND NOT "b"', '"c" OR "d"']})
    itlr = [{"itlr": {"k": 5, "mode": "listed", "pairs": str(pairs)}}]
    pipes = [Pipeline.parse("dense", [{"dense": {"k": 5}}]), Pipeline.parse("itlr", itlr),
             Pipeline.parse("fused", [{"rrf": {"k": 5, "of": [[{"dense": {"k": 5}}], itlr]}}])]
    ctx = Context(store=_Store(), encoder=lambda: _Encoder())

    def run() -> dict[str, list[bool]]:
        inputs = Inputs.of(queries, ctx.store, encoder="stand-in", files=[str(pairs)])
        cache = StageCache(tmp_path / "stages")  # a new cache object each time: read from disk, as a second process does
        out = {}
        for p in pipes:
            steps = p.run(ctx, queries, cache, inputs).steps
            out[p.name] = [s["cached"] for s in steps if "cached" in s] + [t["cached"] for s in steps if "sub" in s for t in s["sub"]]
        return out

    # (the fusion's dense child starts from queries that also carry logical_query: another prefix than dense's own)
    assert run() == {"dense": [False], "itlr": [False], "fused": [False, False, True]}
    assert run() == {"dense": [True], "itlr": [True], "fused": [True, True, True]}
    real = logicrank.pipelines.codedigest.code_digest
    monkeypatch.setattr(logicrank.pipelines.codedigest, "code_digest", lambda m: real(m) + ("-edited" if m == "logicrank.pipelines.retrieval.stages.itlr" else ""))
    # ITLR and the fusion over it are computed again, not dense (the fusion's ITLR child is the ITLR pipeline's new output)
    assert run() == {"dense": [True], "itlr": [False], "fused": [False, True, True]}
    assert run() == {"dense": [True], "itlr": [True], "fused": [True, True, True]}
    monkeypatch.setattr(logicrank.pipelines.codedigest, "code_digest", lambda m: real(m) + ("-edited" if m == "logicrank.pipelines.other" else ""))
    assert run() == {"dense": [True], "itlr": [True], "fused": [True, True, True]}  # (back to the code as it is)


def test_the_runners_own_code_is_part_of_every_key(tmp_path, monkeypatch):
    import logicrank.pipelines.retrieval.runner
    from logicrank.pipelines.retrieval.pipeline import Pipeline
    from logicrank.pipelines.retrieval.runner import Inputs, StageCache
    from logicrank.pipelines.retrieval.stages import Context

    queries = pa.table({"query_id": ["q1"], "text": ["alpha"]})
    p = Pipeline.parse("dense", [{"dense": {"k": 3}}])
    ctx = Context(store=_Store(), encoder=lambda: _Encoder())
    inputs = Inputs.of(queries, ctx.store, encoder="stand-in")
    cache = StageCache(tmp_path)
    first = p.run(ctx, queries, cache, inputs).steps[0]
    monkeypatch.setattr(logicrank.pipelines.retrieval.runner, "code_digest", lambda m: "edited")
    assert not p.run(ctx, queries, cache, inputs).steps[0]["cached"]
    monkeypatch.undo()
    # the code a stage runs through its Context without importing it: the table's reads, the LLM's service
    real = logicrank.pipelines.retrieval.runner.code_digest
    for module in ("logicrank.pipelines.engines.store", "logicrank.jobs.llm_service"):
        monkeypatch.setattr(logicrank.pipelines.retrieval.runner, "code_digest", lambda m, module=module: real(m) + ("-edited" if m == module else ""))
        assert not p.run(ctx, queries, cache, inputs).steps[0]["cached"], module
        monkeypatch.undo()
    # the retrieve job's own code, which batches the queries, searches shards and merges their top k (an edit there
    # served the runs the earlier code made): its source alone
    source = logicrank.pipelines.retrieval.runner.source_digest
    monkeypatch.setattr(logicrank.pipelines.retrieval.runner, "source_digest", lambda m: source(m) + ("-edited" if m == "logicrank.jobs.retrieve" else ""))
    assert not p.run(ctx, queries, cache, inputs).steps[0]["cached"]
    monkeypatch.undo()
    again = p.run(ctx, queries, cache, inputs).steps[0]
    assert again["cached"] and again["digest"] == first["digest"]


def test_inputs_key_the_queries_by_their_content_and_a_relative_table_path_as_its_absolute_one(monkeypatch, tmp_path):
    from logicrank.pipelines.retrieval.runner import Inputs

    class Store:
        name, version = "docs", 3

        def __init__(self, uri):
            self.uri = uri

    q = pa.table({"query_id": ["q1", "q2", "q3"], "text": ["a", "b", None]})
    chunked = pa.concat_tables([q.slice(0, 1), q.slice(1, 2)]).replace_schema_metadata({"x": "y"})
    monkeypatch.chdir(tmp_path)
    assert Inputs.of(q, Store("db")).base == Inputs.of(chunked, Store(str(tmp_path / "db"))).base
    assert Inputs.of(q, Store("db")).base != Inputs.of(q.slice(0, 2), Store("db")).base
    assert Inputs.of(q, Store("db")).base != Inputs.of(q, Store("other")).base

    class Remade(Store):  # the table dropped and made again: the same version number, made at another time
        def version_stamp(self):
            return "2026-12-03T13:00:00"

    assert Inputs.of(q, Remade("db")).base != Inputs.of(q, Store("db")).base


def test_a_jobs_rerun_is_fresh_only_with_the_same_code(tmp_path, monkeypatch):
    """RunDir's check (retrieve, evaluate, decompose; the nightly's evaluation step and --at runs go
    through retrieve's): a manifest records the digest of the job module's code (jobs.<stage>)."""
    import logicrank.pipelines.codedigest
    from logicrank.jobs.rundir import RunDir

    def finished(stage: str) -> RunDir:
        rundir = RunDir(tmp_path / stage, stage)
        (rundir.path / "out.txt").parent.mkdir(parents=True, exist_ok=True)
        (rundir.path / "out.txt").write_text("x")
        rundir.write_manifest({}, "c", {"queries": 1}, ["out.txt"])
        return rundir

    retrieve, other = finished("retrieve"), finished("no-such-job")
    assert retrieve.code() == code_digest("logicrank.jobs.retrieve") == retrieve.previous()["code"] and other.code() is None
    assert retrieve.is_fresh("c", {"queries": 1}) and other.is_fresh("c", {"queries": 1})
    real = logicrank.pipelines.codedigest.code_digest
    monkeypatch.setattr(logicrank.pipelines.codedigest, "code_digest", lambda m: real(m) + ("-edited" if m == "logicrank.jobs.retrieve" else ""))
    assert not RunDir(tmp_path / "retrieve", "retrieve").is_fresh("c", {"queries": 1})  # an edit to what the job runs: run again
    assert other.is_fresh("c", {"queries": 1})


def test_a_module_moved_with_its_code_unchanged_keeps_its_digest(tmp_path):
    """The digest covers the code, not where it sits: the same source under another package
    (a move, issue 52) digests alike, so a table's embedded-by mark and a stage's cache key
    survive a regrouping of the packages; a changed byte still changes it."""
    copy = _copy(tmp_path)
    source = "from logicrank.pipelines import files\n\n\ndef probe():\n    return files\n"
    (copy / "pipelines" / "engines" / "moved_probe.py").write_text(source)
    (copy / "pipelines" / "retrieval" / "moved_probe.py").write_text(source)
    (copy / "pipelines" / "evaluation" / "moved_probe.py").write_text(source + "# edited\n")
    got = _digests(copy, DIGEST, [f"logicrank.pipelines.{p}.moved_probe" for p in ("engines", "retrieval", "evaluation")])
    assert got["logicrank.pipelines.engines.moved_probe"] == got["logicrank.pipelines.retrieval.moved_probe"]
    assert got["logicrank.pipelines.evaluation.moved_probe"] != got["logicrank.pipelines.engines.moved_probe"]


def test_generates_checkpoints_are_keyed_by_the_jobs_own_source_too(monkeypatch):
    """jobs/generate.py decides what each checkpoint holds (the prompts' inputs, constraints,
    token budgets, the label records), and only the recipe's closure keyed the checkpoints: a
    run resumed shards an earlier job code wrote beside new ones."""
    from logicrank.jobs import generate
    from logicrank.pipelines import codedigest

    asked = []
    real = codedigest.source_digest
    monkeypatch.setattr(codedigest, "source_digest", lambda module: asked.append(module) or real(module))
    before = generate.generator_code()
    assert asked == ["logicrank.jobs.generate"]
    monkeypatch.setattr(codedigest, "source_digest", lambda module: "edited")
    assert generate.generator_code() != before


def test_a_run_records_the_code_it_started_with(tmp_path, monkeypatch):
    """The job's code digest was first read when its manifest was written, after the work: an
    edit made while the job ran was recorded beside the earlier code's outputs, and the next
    run, on the edited code, was skipped as fresh."""
    from logicrank.jobs.rundir import RunDir
    from logicrank.pipelines import codedigest

    source = {"digest": "as started"}
    monkeypatch.setattr(codedigest, "code_digest", lambda module: source["digest"])
    rundir = RunDir(tmp_path / "r", "evaluate")
    source["digest"] = "edited while it ran"
    (tmp_path / "r").mkdir()
    rundir.write_manifest({}, "h", {}, [])
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["code"] == "as started"
    assert not RunDir(tmp_path / "r", "evaluate").is_fresh("h", {})  # the edited code runs again
