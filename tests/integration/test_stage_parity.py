"""Every method, now a stage (or a preset pipeline of stages), writes the run tables the
pre-redesign code wrote (commit f87c36f) on the same data: ids and ranks exactly, scores
within tests/compare.py's tolerance (rtol 1e-5, atol 1e-6; float kernels differ between
CPUs), a swap allowed only between documents tied within it.

The reference tables are in tests/data/parity/reference (manifest.json: each run's config and
rows), written once by the pre-redesign code: commit 7c2e3a6's tests/data/parity/make_reference.py
run in a worktree of f87c36f (``git show 7c2e3a6:tests/data/parity/make_reference.py`` has
the command). They are a record of that code's output and are not regenerated from today's
code, which would compare the code with itself; the two fixtures below build the same inputs. BM25
changed on purpose in the redesign (one combined title+text field, stemming and stop words
on both sides): bm25 and hybrid differ from their references, so fusion is checked on the
reference's own input runs, and the rerankers that reranked bm25 rerank the reference's
bm25 run (a ``run_file`` stage). The truth template changed on purpose later (its final
newline), so the LLM rerankers are checked for what they score, not their scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.jobs.retrieve import run_retrieve
from logicrank.pipelines.config.retrieval import RetrieveConfig
from logicrank.pipelines.config.settings import LLMConfig
from logicrank.pipelines.retrieval.logic.query import parse, relabel, to_text
from logicrank.pipelines.retrieval.pipeline import build
from logicrank.pipelines.retrieval.stages import Context
from logicrank.pipelines.retrieval.stages.fusion import RRFOptions
from logicrank.schemas.tables import DECOMPOSITIONS
from tests.compare import assert_runs_close, assert_tables_close
from tests.conftest import scifact_docs, write_jsonl
from tests.integration.conftest import RAY
from tests.tiny_llm import build_tiny_llm

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kept_engines")]  # jobs join the session's cluster, LLM pools kept between them (conftest.py)
REF = Path(__file__).parents[1] / "data" / "parity" / "reference"
TERM_KEYS = ["query_id", "doc_id", "term_id"]
ATOM_KEYS = ["query_id", "doc_id", "atom_id"]


def build_docs300(root: Path) -> tuple[Path, Path]:
    """(queries, db): 300 SciFact documents indexed, 40 title queries q0..q39 (the reference's)."""
    from logicrank.jobs.index import run_index
    from logicrank.pipelines.config.settings import IndexConfig

    docs = scifact_docs(300)
    corpus = write_jsonl(root / "corpus.jsonl", docs)
    run_index(IndexConfig(corpus=str(corpus), db=str(root / "db")), root / "index")
    queries = write_jsonl(root / "queries.jsonl", [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(docs[::7][:40])])
    return queries, root / "db"


def hand_decompositions(queries: list[dict]) -> pa.Table:
    """The reference's decompositions, from the gold logical queries: itlr = the gold form;
    reasoning = the text + " " + its first term; orlog = one atom per term, the gold formula
    over atom ids."""
    blank = {"model": "hand", "prompt_sha": "-", "raw_output": None, "logical_query": None, "atoms": None, "expansion": None,
             "status": "ok", "error": None, "finish_reason": None, "prompt_tokens": 0, "generated_tokens": 0, "cached": False}
    rows = []
    for q in queries:
        ast = parse(q["logical_query"])
        ids = {t: f"a{i + 1}" for i, t in enumerate(ast.terms())}
        rows += [
            {**blank, "query_id": q["_id"], "method": "itlr", "logical_query": q["logical_query"]},
            {**blank, "query_id": q["_id"], "method": "reasoning", "expansion": f"{q['text']} {ast.terms()[0]}"},
            {**blank, "query_id": q["_id"], "method": "orlog", "logical_query": to_text(relabel(ast, ids)),
             "atoms": [{"id": a, "text": f"{{x}} discusses: {t}"} for t, a in ids.items()]},
        ]
    return pa.Table.from_pylist(rows, schema=DECOMPOSITIONS)


def _engine_actors() -> int:
    """How many LLM engine actors this Ray cluster has ever created (alive or not)."""
    from ray._private import state

    return sum("_EngineActor" in a["ActorClassName"] for a in state.actors().values())


def _same(path: Path, ref: str, **tol: float) -> set[tuple[str, str]]:
    """A run table against its reference; returns the documents accepted at a tied cut."""
    return assert_runs_close(pq.read_table(path), pq.read_table(REF / ref), f"{ref} (redesigned stage vs pre-redesign)", **tol)


def _same_side(path: Path, ref: str, keys: list[str], at_cut: set[tuple[str, str]], **tol: float) -> None:
    """A side table (term or predicate scores) against its reference, row by key."""
    assert_tables_close(pq.read_table(path), pq.read_table(REF / ref), keys, ref, may_differ=at_cut, **tol)


@pytest.fixture(scope="module")
def docs300(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity300")
    return build_docs300(root)


def test_dense_matches_and_fusion_of_the_reference_inputs_matches_hybrid(docs300, tmp_path):
    queries, db = docs300
    runs = run_retrieve(RetrieveConfig.preset(("dense", "bm25"), queries=str(queries), db=str(db), set={"dense.k": 20, "bm25.k": 20}, ray=RAY), tmp_path / "r")
    _same(runs["dense"], "docs300/dense.parquet")
    assert not pq.read_table(runs["bm25"]).equals(pq.read_table(REF / "docs300/bm25.parquet"))  # changed on purpose
    # the rrf stage on the reference's dense and bm25 runs (k=20) gives the reference's hybrid
    # of those two runs (hybrid_depth=20)
    rrf = build(RRFOptions(k=20, of=(("dense",), ("bm25",))))
    ref_runs = [pq.read_table(REF / f"docs300/{m}.parquet") for m in ("dense", "bm25")]
    fused = rrf.run(Context(store=None), None, ref_runs).run
    old = pq.read_table(REF / "docs300/depth20-hybrid.parquet")
    assert old.num_rows == 800
    assert_runs_close(fused.drop(["run_id"]), old.drop(["run_id"]), "rrf of the reference's runs vs its depth-20 hybrid")


def test_itlr_expansion_and_llm_rerankers_match(synthetic, tmp_path):
    queries, db = synthetic / "syn" / "queries.jsonl", str(synthetic / "db")
    syn = dict(queries=str(queries), db=db, ray=RAY)
    dec = REF / "synthetic" / "decompositions.parquet"
    rows = [json.loads(line) for line in queries.read_text(encoding="utf-8").splitlines()]
    # the fixture is the reference's, written before the question_sha column (a table without it
    # is read as one whose rows are not checked against the question text)
    assert pq.read_table(dec).equals(hand_decompositions(rows).drop(["question_sha"]))

    for tag, kw in {"itlr-none": {}, "itlr-zscore": {"calibration": "zscore"}, "itlr-ann": {"mode": "ann", "ann_k": 20}}.items():
        out = tmp_path / tag
        runs = run_retrieve(RetrieveConfig.preset(("itlr",), tag, **syn, set={"itlr.k": 10} | {f"itlr.{o}": v for o, v in kw.items()}), out)
        at_cut = _same(runs[f"{tag}-itlr"], f"synthetic/{tag}-itlr.parquet")
        _same_side(out / "term_scores" / f"{tag}-itlr.parquet", f"synthetic/term_scores-{tag}-itlr.parquet", TERM_KEYS, at_cut)
    runs = run_retrieve(RetrieveConfig(pipelines={  # the LLM's logical queries and expansions, read from the table
        "dec-itlr": [{"decomposition": {"target": "itlr", "decompositions": str(dec)}}, {"itlr": {"k": 10}}],
        "dec-expansion": [{"expansion": {"decompositions": str(dec)}}, {"dense": {"k": 10}}]}, **syn), tmp_path / "dec")
    _same_side(tmp_path / "dec" / "term_scores" / "dec-itlr.parquet", "synthetic/term_scores-dec-itlr.parquet", TERM_KEYS,
               _same(runs["dec-itlr"], "synthetic/dec-itlr.parquet"))
    _same(runs["dec-expansion"], "synthetic/dec-expansion.parquet")

    # OrLog and the reasoner on the tiny LLM: reranking the reference's bm25 run, and OrLog with
    # content-free calibration over dense (unchanged), all in one job: one engine pool
    q6 = write_jsonl(tmp_path / "q6.jsonl", rows[:6])
    llm = LLMConfig(model=str(build_tiny_llm(tmp_path / "tiny-llama")), max_model_len=1024, cache=None, max_num_seqs=64)
    base = {"run_file": {"path": str(REF / "synthetic" / "llm-bm25.parquet")}}
    decomposition = {"decomposition": {"target": "orlog", "decompositions": str(dec)}}
    pipelines = {
        "llm-orlog": [decomposition, base, {"orlog": {"k": 5, "depth": 5, "context_tokens": 32}}],
        "llm-reasoner": [base, {"reasoner": {"k": 5, "depth": 5, "context_tokens": 32}}],
        "llm-cf-orlog": [decomposition, {"dense": {"k": 5}}, {"orlog": {"k": 5, "depth": 5, "context_tokens": 32, "calibration": "content-free"}}],
    }
    out = tmp_path / "llm"
    engines_before = _engine_actors()
    runs = run_retrieve(RetrieveConfig(queries=str(q6), db=db, pipelines=pipelines, llm=llm, ray=RAY), out)
    assert _engine_actors() - engines_before == 1  # Ray's own actor table: one engine for the three LLM pipelines
    # The truth template changed on purpose after the reference was written: it ended in a newline after
    # "Answer:", so the labels " True" / " False" were read one token late (CHANGELOG). P(True), and so these
    # rerankers' scores and order, differ from the reference's by design; what they score must not: the same
    # candidates of each query (the reference's bm25 run, dense's top 5) and OrLog's same prompts' keys and atoms.
    def pairs(table: pa.Table, keys: list[str]) -> list[tuple]:
        return sorted(zip(*(table.column(k).to_pylist() for k in keys), strict=True))

    for rid, path in runs.items():
        assert pairs(pq.read_table(path), ["query_id", "doc_id"]) == pairs(pq.read_table(REF / "synthetic" / f"{rid}.parquet"),
                                                                          ["query_id", "doc_id"]), rid
    for rid in ("llm-orlog", "llm-cf-orlog"):
        got, ref = (pq.read_table(p) for p in (out / "predicate_scores" / f"{rid}.parquet", REF / "synthetic" / f"predicate_scores-{rid}.parquet"))
        assert pairs(got, [*ATOM_KEYS, "atom"]) == pairs(ref, [*ATOM_KEYS, "atom"]), rid
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["llm"]["pools"] == 1 and manifest["llm"]["actors_started"] == 1
