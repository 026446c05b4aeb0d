"""LLM stages in shards (pipelines/retrieval/stages/shards.py): which shards a checkpoint holds, atomic
writes, a shard of another input ignored, a resume that computes only the missing shards and
equals one pass; OrLog's truth scoring through it, killed and resumed, on a scripted LLM."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pytest

from logicrank.pipelines.config.settings import LLMConfig
from logicrank.pipelines.llm.engine import Truth
from logicrank.pipelines.retrieval.runner import Hooks, Inputs, StageCache, StageRunner
from logicrank.pipelines.retrieval.stages import shards
from logicrank.pipelines.retrieval.stages.base import Checkpoint, Context, Kind, Output, Stage, StageOptions

UNITS = [f"q{i}" for i in range(7)]


class Killed(Exception):
    """The job stopped from outside (a test's kill)."""


def _compute(log: list[list[str]], fail_at_wave: int | None = None):
    """Each shard's table (one row per unit, a value from its id) and a second table; records
    the units it was asked; raises on the ``fail_at_wave``-th call (a wave in flight when the
    job dies)."""

    def compute(wave: list[list[str]]) -> list[dict[str, pa.Table]]:
        if fail_at_wave is not None and len(log) + 1 == fail_at_wave:
            raise Killed("killed in flight")
        log.append([u for s in wave for u in s])
        return [{"main": pa.table({"unit": s, "value": [int(u[1:]) * 1.5 for u in s]}),
                 "extra": pa.table({"unit": s, "n": [len(s)] * len(s)})} for s in wave]

    return compute


def test_cut_into_consecutive_shards():
    assert shards.cut(UNITS, 3) == [["q0", "q1", "q2"], ["q3", "q4", "q5"], ["q6"]]
    assert shards.cut([], 3) == []


def test_resume_computes_only_the_missing_shards_and_equals_one_pass(tmp_path):
    cp = Checkpoint(tmp_path / "key.partial", "key")
    parts = shards.cut(UNITS, 2)  # 4 shards
    one_pass = _compute([])([UNITS])[0]
    first: list[list[str]] = []
    with pytest.raises(Killed):
        shards.run_shards(cp, parts, _compute(first, fail_at_wave=2), wave=2, label="t")  # the second wave dies in flight
    assert first == [["q0", "q1", "q2", "q3"]]
    assert shards.finished(cp.where, "key", parts) == [0, 1]  # the first wave's two shards, nothing of the second
    lines: list[str] = []
    second: list[list[str]] = []
    tables, counts = shards.run_shards(cp, parts, _compute(second), wave=2, label="t", echo=lines.append)
    assert second == [["q4", "q5", "q6"]]  # only the missing shards
    assert counts == {"shards": 4, "shard_units": 2, "shards_resumed": 2}
    assert lines == ["t: 2 of 4 shards read from checkpoints (" + str(cp.where) + ")",
                     "t: shard 3 of 4 written (3 of 4 done)", "t: shard 4 of 4 written (4 of 4 done)"]
    main = pa.concat_tables([t["main"] for t in tables])
    assert main.equals(one_pass["main"]) and main.schema.metadata is None  # the tag is taken off what was read back
    assert pa.concat_tables([t["extra"] for t in tables]).column("unit").to_pylist() == UNITS
    again: list[list[str]] = []
    shards.run_shards(cp, parts, _compute(again), wave=2, label="t")
    assert again == []  # everything read back


def test_a_shard_of_another_key_or_other_units_is_not_read(tmp_path):
    cp = Checkpoint(tmp_path / "p", "key-a")
    shards.run_shards(cp, shards.cut(UNITS, 3), _compute([]), wave=1, label="t")
    assert shards.finished(cp.where, "key-a", shards.cut(UNITS, 3)) == [0, 1, 2]
    assert shards.finished(cp.where, "key-b", shards.cut(UNITS, 3)) == []  # another stage key (other inputs, options, code)
    assert shards.finished(cp.where, "key-a", shards.cut(UNITS, 2)) == []  # the same key cut at another shard size
    other = shards.cut(["q0", "q1", "x2", *UNITS[3:]], 3)  # the first shard's units differ, the others are the same
    assert shards.finished(cp.where, "key-a", other) == [1, 2]
    log: list[list[str]] = []
    tables, counts = shards.run_shards(Checkpoint(cp.where, "key-b"), shards.cut(UNITS, 3), _compute(log), wave=3, label="t")
    assert log == [UNITS] and counts["shards_resumed"] == 0  # computed again, and written over
    assert shards.read_tag(cp.where, 0)["key"] == "key-b"


def test_only_a_whole_shard_counts(tmp_path):
    """A shard is finished once its main file, written last, holds the tag: a leftover
    temporary file, an extra table without its main file, a cut-off or untagged file are not."""
    where = tmp_path / "p"
    parts = shards.cut(UNITS, 2)
    shards.write_shard(where, 0, shards.tag("k", parts[0]), {"main": pa.table({"a": [1]}), "extra": pa.table({"b": [2]})})
    (where / ".shard-00001.parquet.123.tmp").write_bytes(b"PAR1 half a file")  # a process killed while writing
    pa.parquet.write_table(pa.table({"b": [2]}), shards.shard_path(where, 2, "extra"))  # killed between the extra and the main file
    shards.shard_path(where, 3).write_bytes(b"PAR1 cut off")
    assert shards.finished(where, "k", parts) == [0]
    pa.parquet.write_table(pa.table({"a": [1]}), shards.shard_path(where, 3))  # readable, but no tag: not ours
    assert shards.finished(where, "k", parts) == [0]
    assert shards.read_shard(where, 0)["extra"].column("b").to_pylist() == [2]


def test_a_shard_rewritten_for_another_cut_and_killed_leaves_no_shard_of_mixed_tables(tmp_path, monkeypatch):
    """Shard 0 written for units [a, b], then rewritten for [a, b, c] (another shard size under
    the same key) and killed between its extras and its main file: the old main file must not
    stand beside the new extras, to be read with them by a rerun of the first cut."""
    where = tmp_path / "p"
    tables = lambda ids: {"main": pa.table({"u": ids}), "extra": pa.table({"u": ids})}  # noqa: E731
    shards.write_shard(where, 0, shards.tag("k", ["a", "b"]), tables(["a", "b"]))
    write = shards.write_parquet_atomic

    def killed_at_the_main_file(table, path):
        if path == shards.shard_path(where, 0):
            raise KeyboardInterrupt("killed")
        write(table, path)

    monkeypatch.setattr(shards, "write_parquet_atomic", killed_at_the_main_file)
    with pytest.raises(KeyboardInterrupt):
        shards.write_shard(where, 0, shards.tag("k", ["a", "b", "c"]), tables(["a", "b", "c"]))
    monkeypatch.undo()
    assert shards.finished(where, "k", [["a", "b"]]) == []  # computed again, not read with [a, b, c]'s extra


def test_a_write_that_fails_leaves_no_shard(tmp_path, monkeypatch):
    import logicrank.pipelines.files as files

    def half(table, path, **kw):
        with open(path, "wb") as f:
            f.write(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr(files.pq, "write_table", half)
    with pytest.raises(OSError, match="disk full"):
        shards.write_shard(tmp_path / "p", 0, shards.tag("k", ["q0"]), {"main": pa.table({"a": [1]})})
    assert list((tmp_path / "p").iterdir()) == []  # neither the shard nor its temporary file


def test_without_a_checkpoint_one_pass_and_nothing_written(tmp_path):
    log: list[list[str]] = []
    tables, counts = shards.in_shards(Context(store=None), UNITS, _compute(log), "t")  # a notebook without a cache directory
    assert log == [UNITS] and len(tables) == 1 and counts == {}
    assert shards.in_shards(Context(store=None), [], _compute(log), "t") == ([], {})


class _Probe(Stage):
    """A stage that reports the checkpoint the runner gave it."""

    name, kind, Options = "probe", Kind.RERANKER, StageOptions
    seen: list = []

    def run(self, ctx, queries, runs):
        type(self).seen.append(ctx.checkpoint)
        if ctx.checkpoint is not None:
            (ctx.checkpoint.where / "shard-00000.parquet").parent.mkdir(parents=True, exist_ok=True)
            (ctx.checkpoint.where / "shard-00000.parquet").write_bytes(b"x")
        return Output(counts={"n": 1})


def test_the_runner_gives_a_checkpoint_of_the_stage_key_and_removes_it_once_cached(tmp_path):
    queries = pa.table({"query_id": ["q1"], "text": ["t"]})
    for root in (tmp_path / "stages", None):
        cache = StageCache(root)
        _Probe.seen.clear()
        StageRunner(Context(store=None), Inputs("base"), cache, Hooks()).run_stage("abc", _Probe(StageOptions()), queries, [])
        if root is None:
            assert _Probe.seen == [None]  # a notebook without a cache directory: one pass, as before
        else:
            assert _Probe.seen == [Checkpoint(root / "abc.partial", "abc")]
            assert (root / "abc" / "done.json").is_file() and not (root / "abc.partial").exists()  # cached whole, shards removed


# ------------------------------------------------------------------------------ OrLog's truth scoring in shards
class _ScriptedTruth:
    """An LLM whose logits follow from each prompt's text (deterministic); counts the prompts sent."""

    def __init__(self, shard_queries: int = 2, wave_shards: int = 1):
        self.cfg = LLMConfig(cache=None, shard_queries=shard_queries, wave_shards=wave_shards)
        self.model_id = "scripted"
        self.sent: list[str] = []

    def truth(self, template, values, label=None, keys=None):
        texts = [template.render(**v) for v in values]
        self.sent += texts
        out = []
        for t in texts:
            z = int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) / 2**32 * 8 - 4
            out.append(Truth(1 / (1 + np.exp(-z)), z, 0.0, True, len(t), 0))
        return out


class _Titles:
    def rows_for(self, doc_ids, columns):
        return pa.table({"doc_id": list(doc_ids), "title": [f"Title {d}" for d in doc_ids], "text": [f"text of {d}" for d in doc_ids]})


def _orlog_inputs(n_queries: int = 5, depth: int = 3):
    from logicrank.schemas.tables import RUN

    atoms = [{"id": "a1", "text": "{x} mentions cells"}, {"id": "a2", "text": "{x} is about cancer"}]
    qids = [f"q{i}" for i in range(n_queries)]
    queries = pa.table({"query_id": qids, "text": [f"question {q}" for q in qids], "atoms": [atoms] * n_queries,
                        "logical_query": ['"a1" AND NOT "a2"'] * n_queries, "decomposition_status": ["ok"] * n_queries})
    rows = [{"query_id": q, "doc_id": f"d{(i * 7 + r) % 11}", "rank": r + 1, "score": 1.0 / (r + 1), "method": "bm25", "run_id": "bm25"}
            for i, q in enumerate(qids) for r in range(depth)]
    return queries, pa.Table.from_pylist(rows, schema=RUN)


@pytest.mark.parametrize("calibration", ["none", "content-free", "pool-mean"])
def test_orlog_killed_after_two_shards_resumes_the_rest_and_equals_one_pass(tmp_path, calibration):
    from logicrank.pipelines.retrieval.stages.orlog import Orlog, OrlogOptions

    queries, run = _orlog_inputs()
    stage = Orlog(OrlogOptions(k=3, depth=3, context=False, calibration=calibration))
    whole = _ScriptedTruth()
    one_pass = stage.run(Context(store=_Titles(), llm=lambda: whole), queries, [run])  # no checkpoint: as in a notebook

    cp = Checkpoint(tmp_path / "k.partial", "k")

    def kill_after_two(line: str) -> None:  # the progress line of a written shard: the observable event
        if len(list(cp.where.glob("shard-?????.parquet"))) == 2:
            raise Killed(line)

    first = _ScriptedTruth(shard_queries=2, wave_shards=1)
    with pytest.raises(Killed):
        stage.run(Context(store=_Titles(), llm=lambda: first, echo=kill_after_two, checkpoint=cp), queries, [run])
    resumed = _ScriptedTruth(shard_queries=2, wave_shards=1)
    out = stage.run(Context(store=_Titles(), llm=lambda: resumed, checkpoint=cp), queries, [run])
    per_query = 3 * 2 + (2 if calibration == "content-free" else 0)  # candidates x atoms, and the atoms about "N/A"
    assert len(whole.sent) == 5 * per_query and len(first.sent) == 4 * per_query
    assert len(resumed.sent) == per_query and set(resumed.sent) <= set(whole.sent)  # the last shard (one query) only
    assert out.counts["shards"] == 3 and out.counts["shards_resumed"] == 2
    assert out.run.select(["query_id", "doc_id", "rank"]).equals(one_pass.run.select(["query_id", "doc_id", "rank"]))
    np.testing.assert_allclose(out.run.column("score").to_numpy(), one_pass.run.column("score").to_numpy(), rtol=0, atol=1e-12)
    got, want = out.side["predicate_scores"].to_pandas(), one_pass.side["predicate_scores"].to_pandas()
    assert got[["query_id", "doc_id", "atom_id"]].equals(want[["query_id", "doc_id", "atom_id"]])
    np.testing.assert_allclose(got["p_true"], want["p_true"], rtol=0, atol=1e-12)
    costs = ("pairs", "forward_passes", "prompt_tokens", "llm_cache_hits")
    assert {c: out.counts[c] for c in costs} == {c: one_pass.counts[c] for c in costs}
    assert json.dumps(out.counts, default=str)  # the manifest holds them


# ------------------------------------------------------------------------------ decomposition in shards
class _ScriptedDecomposer:
    """An LLM that decomposes each question into one atom naming it (orlog's JSON); counts the prompts sent."""

    def __init__(self, shard_queries: int = 2, wave_shards: int = 1):
        self.cfg = LLMConfig(cache=None, shard_queries=shard_queries, wave_shards=wave_shards)
        self.model_id = "scripted"
        self.sent: list[str] = []

    def generate(self, template, values, constraint=None, max_tokens=256, temperature=0.0, seed=None, label=None):
        from logicrank.pipelines.llm.engine import Generation

        self.sent += [v["question"] for v in values]
        return [Generation(json.dumps({"atoms": [{"id": "a1", "text": "{x} answers " + v["question"]}], "form": '"a1"'}), "stop", 10, 0, 5)
                for v in values]


def test_decomposition_killed_after_two_shards_resumes_the_rest_and_equals_one_pass(tmp_path):
    from logicrank.pipelines.retrieval.stages.rewriters import Decomposition, DecompositionOptions

    queries = pa.table({"query_id": UNITS, "text": [f"question {q}" for q in UNITS]})
    stage = Decomposition(DecompositionOptions(target="orlog"))
    whole = _ScriptedDecomposer()
    one_pass = stage.run(Context(store=None, llm=lambda: whole), queries, [])
    cp = Checkpoint(tmp_path / "k.partial", "k")

    def kill_after_two(line: str) -> None:
        if len(list(cp.where.glob("shard-?????.parquet"))) == 2:
            raise Killed(line)

    with pytest.raises(Killed):
        stage.run(Context(store=None, llm=lambda: _ScriptedDecomposer(), echo=kill_after_two, checkpoint=cp), queries, [])
    resumed = _ScriptedDecomposer()
    out = stage.run(Context(store=None, llm=lambda: resumed, checkpoint=cp), queries, [])
    assert len(whole.sent) == 7 and resumed.sent == ["question q4", "question q5", "question q6"]  # shards 3 and 4 of 2, 2, 2, 1
    assert out.counts["shards"] == 4 and out.counts["shards_resumed"] == 2
    assert out.queries.equals(one_pass.queries) and out.side["decompositions"].equals(one_pass.side["decompositions"])
    assert out.queries.column("logical_query").to_pylist() == ['"a1"'] * 7  # the decompositions were applied


def test_reasoner_in_shards_resumes_and_equals_one_pass(tmp_path):
    from logicrank.pipelines.retrieval.stages.orlog import Reasoner, ReasonerOptions

    queries, run = _orlog_inputs()
    stage = Reasoner(ReasonerOptions(k=3, depth=3, context=False))
    whole = _ScriptedTruth()
    one_pass = stage.run(Context(store=_Titles(), llm=lambda: whole), queries, [run])
    cp = Checkpoint(tmp_path / "k.partial", "k")
    done = _ScriptedTruth(shard_queries=2, wave_shards=2)
    stage.run(Context(store=_Titles(), llm=lambda: done, checkpoint=cp), queries, [run])
    (cp.where / "shard-00001.parquet").unlink()  # as if the job had died before the second shard was written
    resumed = _ScriptedTruth(shard_queries=2, wave_shards=2)
    out = stage.run(Context(store=_Titles(), llm=lambda: resumed, checkpoint=cp), queries, [run])
    assert len(done.sent) == len(whole.sent) == 15 and len(resumed.sent) == 6  # 2 queries x 3 candidates: the missing shard only
    assert out.run.select(["query_id", "doc_id", "rank"]).equals(one_pass.run.select(["query_id", "doc_id", "rank"]))
    np.testing.assert_allclose(out.run.column("score").to_numpy(), one_pass.run.column("score").to_numpy(), rtol=0, atol=1e-12)


class _Reverser:
    """An LLM that reverses every R3 window; counts the windows sent."""

    def __init__(self, shard_queries: int = 2, wave_shards: int = 1):
        self.cfg = LLMConfig(cache=None, shard_queries=shard_queries, wave_shards=wave_shards)
        self.model_id = "scripted"
        self.sent: list[str] = []

    def generate(self, template, values, constraint=None, max_tokens=256, temperature=0.0, seed=None, label=None):
        from logicrank.pipelines.llm.engine import Generation

        self.sent += [v["query"] for v in values]
        return [Generation(" > ".join(f"[{i}]" for i in range(int(v["n"]), 0, -1)), "stop", 10, 0, 5) for v in values]


def test_r3_killed_after_two_shards_resumes_the_rest_and_equals_one_pass(tmp_path, monkeypatch):
    from logicrank.pipelines.retrieval.methods.rules import R3Options
    from logicrank.pipelines.retrieval.stages import rules as stage_module
    from logicrank.pipelines.retrieval.stages.rules import R3

    monkeypatch.setattr(stage_module.templates, "cut_to_tokens", lambda model, texts, budget: texts)  # no tokenizer here
    queries, run = _orlog_inputs(n_queries=5, depth=6)
    stage = R3(R3Options(k=6, n=6, window=4, stride=2))  # two windows per query
    whole = _Reverser()
    one_pass = stage.run(Context(store=_Titles(), llm=lambda: whole), queries, [run])
    cp = Checkpoint(tmp_path / "k.partial", "k")

    def kill_after_two(line: str) -> None:
        if len(list(cp.where.glob("shard-?????.parquet"))) == 2:
            raise Killed(line)

    with pytest.raises(Killed):
        stage.run(Context(store=_Titles(), llm=lambda: _Reverser(), echo=kill_after_two, checkpoint=cp), queries, [run])
    resumed = _Reverser()
    out = stage.run(Context(store=_Titles(), llm=lambda: resumed, checkpoint=cp), queries, [run])
    assert len(whole.sent) == 5 * 2 and len(resumed.sent) == 1 * 2  # the last shard's query, two windows
    assert out.run.equals(one_pass.run)
    windows = ["query_id", "window", "start", "end", "permutation"]
    assert out.side["rerank_windows"].select(windows).sort_by([("query_id", "ascending"), ("window", "ascending")]).equals(
        one_pass.side["rerank_windows"].select(windows).sort_by([("query_id", "ascending"), ("window", "ascending")]))
    assert out.counts["windows"] == one_pass.counts["windows"] == 10 and out.counts["shards_resumed"] == 2


# ------------------------------------------------------------------------------ LAG in shards
class _AxisStore:
    """test_lag's four passages on orthogonal axes, as a table the stage searches (exact cosine)."""

    def __init__(self):
        from tests.unit.test_lag import DOCS

        self.ids, self.mat = list(DOCS), np.stack(list(DOCS.values())).astype(np.float32)

    def vector_search(self, vectors, k, with_vectors=True):
        from logicrank.pipelines.engines.embed import to_fixed_size_list

        rows = [(qi, i, float(self.mat[i] @ v)) for qi, v in enumerate(vectors) for i in np.argsort(-(self.mat @ v), kind="stable")[:k]]
        return pa.table({"query_index": [r[0] for r in rows], "doc_id": [self.ids[r[1]] for r in rows], "score": [r[2] for r in rows],
                         "vector": to_fixed_size_list(self.mat[[r[1] for r in rows]])})

    def rows_for(self, doc_ids, columns):
        return pa.table({"doc_id": list(doc_ids), "title": [""] * len(doc_ids), "text": [f"passage {d}" for d in doc_ids]})


class _AxisEncoder:
    def encode(self, texts):
        from tests.unit.test_lag import axis_of

        return np.stack([axis_of(t) for t in texts]).astype(np.float32)


def test_lag_killed_after_two_shards_resumes_the_rest_and_equals_one_pass(tmp_path, monkeypatch):
    from logicrank.pipelines.retrieval.methods.lag import LagOptions
    from logicrank.pipelines.retrieval.stages import lag as stage_module
    from logicrank.pipelines.retrieval.stages.lag import Lag

    monkeypatch.setattr(stage_module.templates, "cut_to_tokens", lambda model, texts, budget: texts)  # no tokenizer here
    axes = ["alpha", "beta", "gamma", "delta"]
    qids = [f"q{i}" for i in range(5)]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"query_id": q, "decomposition": [{"question": f"{axes[i % 4]}: who?", "answer": "?"},
                                                                         {"question": f"{axes[(i + 1) % 4]}: of #1?", "answer": "?"}]}) + "\n"
                            for i, q in enumerate(qids)))
    queries = pa.table({"query_id": qids, "text": [f"question {q}" for q in qids]})
    stage = Lag(LagOptions(k=1, plan="gold", sub_answers="llm", synthesis=True, gold=str(gold)))

    class Answers:
        def __init__(self, shard_queries=2, wave_shards=1):
            self.cfg, self.model_id, self.sent = LLMConfig(cache=None, shard_queries=shard_queries, wave_shards=wave_shards), "scripted", []

        def generate(self, template, values, constraint=None, max_tokens=256, temperature=0.0, seed=None, label=None):
            from logicrank.pipelines.llm.engine import Generation

            self.sent += [template.render(**v) for v in values]
            return [Generation("Ann", "stop", 10, 0, 3) for _ in values]

    def ctx(llm, **kw):
        return Context(store=_AxisStore(), encoder=lambda: _AxisEncoder(), llm=lambda: llm, **kw)

    whole = Answers()
    one_pass = stage.run(ctx(whole), queries, [])
    cp = Checkpoint(tmp_path / "k.partial", "k")

    def kill_after_two(line: str) -> None:
        if len(list(cp.where.glob("shard-?????.parquet"))) == 2:
            raise Killed(line)

    with pytest.raises(Killed):
        stage.run(ctx(Answers(), echo=kill_after_two, checkpoint=cp), queries, [])
    resumed = Answers()
    out = stage.run(ctx(resumed, checkpoint=cp), queries, [])
    assert len(resumed.sent) * 5 == len(whole.sent) and set(resumed.sent) <= set(whole.sent)  # one question of five: the last shard
    assert out.run.equals(one_pass.run) and out.counts["shards_resumed"] == 2
    for name in ("answers", "lag_steps"):
        assert out.side[name].equals(one_pass.side[name]), name
    assert {k: v for k, v in out.counts.items() if not k.startswith("shard")} == {k: v for k, v in one_pass.counts.items() if not k.startswith("shard")}
    assert out.counts["questions"] == 5 and out.counts["steps_max"] == 2


def test_lag_counts_from_its_tables_equal_those_from_its_chains():
    """A resumed LAG stage counts from the tables its shards hold (no chains): the same counts."""
    from logicrank.pipelines.retrieval.methods import lag
    from logicrank.pipelines.retrieval.stages.lag import counts_of
    from tests.unit.test_lag import AXES, DOCS, ScriptedLLM, VectorRetriever, axis_of, gen, texts_of

    s = lag.LagOptions(k=1, plan="gold", sub_answers="llm", t_max=3, gold="gold.jsonl")
    gold = {"done": [{"question": "alpha: who?", "answer": "?"}, {"question": "beta: of #1?", "answer": "?"}],
            "nosupport": [{"question": "alpha: who?", "answer": "?"}, {"question": "nothing here", "answer": "?"}],
            "budget": [{"question": f"{a}: x?", "answer": "?"} for a in AXES], "unanswerable": [{"question": "gamma: who?", "answer": "?"}]}
    llm = ScriptedLLM(lambda name, v: gen("unknown" if v.get("question") == "gamma: who?" else "Ann"))
    chains = lag.plan(llm, list(gold), [f"question {q}" for q in gold], s, gold)
    lag.solve(chains, VectorRetriever(DOCS, axis_of), llm, texts_of, s)
    lag.synthesise(chains, VectorRetriever(DOCS, axis_of), llm, texts_of, s)
    answers, steps, _ = lag.tables(chains, llm.model_id, "lag", s)
    assert counts_of(answers, steps) == lag.counts(chains)
    assert len(lag.counts(chains)["stop_reasons"]) == 4  # the comparison covers every stop reason
