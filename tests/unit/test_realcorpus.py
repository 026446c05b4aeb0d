"""ITLR's real-corpus recipe, the pieces without Ray or an LLM (the job: tests/integration/test_generate.py)."""

from collections import Counter

import numpy as np
import pytest

from logicrank.pipelines.config.settings import GenerateConfig, LLMConfig, RayConfig
from logicrank.pipelines.generate import realcorpus as rc
from logicrank.pipelines.generate.synthetic import TEMPLATES
from logicrank.pipelines.retrieval.logic.query import parse


def test_topics_parse_keep_usable_distinct_ones_and_fall_back_to_the_title():
    raw = '["vitamin D", "Vitamin D", "] 2018-01-01", "a \\"quoted\\" one", "bone health", "x"]'
    assert rc.parse_topics(raw, 3) == ["vitamin D", "bone health"]
    assert rc.parse_topics("not json", 3) == [] and rc.parse_topics('{"a": 1}', 3) == []
    assert rc.fallback_topic("Bone density in women.", "text") == "Bone density in women"
    assert rc.fallback_topic("", 'The "first" eight words of the text are the topic here') == "The first eight words of the text are"


def test_templates_are_filled_with_three_documents_topics_evenly_and_reproducibly():
    topics = {f"d{i}": [f"topic {i}a", f"topic {i}b"] for i in range(5)} | {"empty": []}
    drafts = rc.fill_templates(2, topics, 8, seed=7)
    assert drafts == rc.fill_templates(2, topics, 8, seed=7) and drafts != rc.fill_templates(2, topics, 8, seed=8)
    assert [d.template for d in drafts] == [TEMPLATES[(16 + j) % 32] for j in range(8)]
    for d in drafts:
        assert len(set(d.source_doc_ids)) == 3 and "empty" not in d.source_doc_ids
        assert all(t in topics[doc] for t, doc in zip(d.terms, d.source_doc_ids, strict=True))
        assert parse(d.logical_query).terms() == d.terms
    counts = Counter(t for s in range(4) for t in (d.template.name for d in rc.fill_templates(s, topics, 8, 0)))
    assert set(counts.values()) == {1} and len(counts) == 32  # 4 shards x 8: every template once
    assert rc.fill_templates(0, {"a": ["x y"], "b": ["y z"]}, 4, 0) == []  # fewer than three documents with topics


def test_a_shard_whose_documents_share_topics_gives_queries_of_three_distinct_topics():
    """Documents of one shard often share a topic ("COVID-19"): a query is filled with three
    different topics (case aside), never ``"COVID-19" AND NOT "covid-19"``, and a shard with
    fewer than three different topics gives none."""
    topics = {f"d{i}": ["COVID-19", f"topic {i}"] for i in range(4)} | {"d4": ["covid-19"], "d5": ["Covid-19", "masks"]}
    for seed in range(20):
        drafts = rc.fill_templates(1, topics, 8, seed)
        assert len(drafts) == 8
        for d in drafts:
            assert len({t.lower() for t in d.terms}) == 3 and len(set(d.source_doc_ids)) == 3, d
            assert all(t in topics[doc] for t, doc in zip(d.terms, d.source_doc_ids, strict=True))
            assert parse(d.logical_query).terms() == d.terms
    assert rc.fill_templates(0, {f"d{i}": ["COVID-19", "Masks"] for i in range(5)} | {"d9": ["masks"]}, 4, 0) == []
    # one way only (a/x, b/y, d/z): a draw that takes x from b first must still find it, not leave the shard empty
    narrow = {"a": ["x"], "b": ["x", "y"], "c": ["x"], "d": ["z"]}
    for seed in range(50):
        drafts = rc.fill_templates(0, narrow, 3, seed)
        assert len(drafts) == 3 and all(len({t.lower() for t in d.terms}) == 3 for d in drafts), seed


def test_questions_must_be_one_capitalised_line_ending_in_a_question_mark():
    assert rc.usable_question("Which trials  report vitamin D?") == "Which trials report vitamin D?"
    for bad in ("which trials?", "Which trials", 'Which "trials"?', "Why?", None):
        assert rc.usable_question(bad) is None
    d = rc.fill_templates(0, {f"d{i}": [f"t{i}"] for i in range(3)}, 1, 0)[0]
    assert rc.usable_question(rc.fallback_question(d)) == rc.fallback_question(d)


def test_an_llm_output_becomes_its_row_or_the_counted_fallback_and_an_engine_error_is_kept():
    row = rc.topic_row("d1", 3, '["vitamin D", "bone health"]', "Title.", "text", 3)
    assert row == {"doc_id": "d1", "shard": 3, "topics": ["vitamin D", "bone health"], "status": "ok", "raw_output": '["vitamin D", "bone health"]'}
    assert rc.topic_row("d1", 3, "not json", "Bone density.", "t", 3) | {"raw_output": "-"} == {
        "doc_id": "d1", "shard": 3, "topics": ["Bone density"], "status": "fallback", "raw_output": "-"}
    failed = rc.topic_row("d1", 3, RuntimeError("engine died"), "Bone density.", "t", 3)
    assert failed["status"] == "fallback" and failed["raw_output"] == "error: engine died"
    d = rc.fill_templates(0, {f"d{i}": [f"t{i}"] for i in range(3)}, 1, 0)[0]
    ok = rc.question_row(d, 0, "Which trials report t0?")
    assert (ok["text"], ok["status"], ok["logical_query"], ok["terms"]) == ("Which trials report t0?", "ok", d.logical_query, list(d.terms))
    for output, raw in (("no question here", "no question here"), (ValueError("cut"), "error: cut")):
        row = rc.question_row(d, 0, output)
        assert (row["text"], row["status"], row["raw_output"]) == (rc.fallback_question(d), "fallback", raw)


def test_an_exact_copy_of_a_near_duplicate_counts_as_exact():
    ids = ["g-0", "g-1", "g-2"]
    texts = ["Is aspirin linked to bleeding?", "Is aspirin linked with bleeding?", "is aspirin linked with bleeding"]
    v = np.array([[1.0, 0.0], [0.99, 0.141], [0.99, 0.141]])
    kept, dropped = rc.dedup(ids, texts, v / np.linalg.norm(v, axis=1, keepdims=True), threshold=0.95)
    assert kept == [0] and dropped["g-1"].startswith("near g-0 ") and dropped["g-2"] == "exact g-1"
    # a copy whose own embedding is not near what was kept is kept, as the embedding decides
    v = np.array([[1.0, 0.0], [0.99, 0.141], [0.0, 1.0]])
    kept, dropped = rc.dedup(ids, texts, v / np.linalg.norm(v, axis=1, keepdims=True), threshold=0.95)
    assert kept == [0, 2] and list(dropped) == ["g-1"]


def test_dedup_drops_exact_then_near_duplicates_keeping_the_first():
    ids = ["q1", "q2", "q3", "q4"]
    texts = ["Which drugs lower IL-6?", "which drugs lower IL6", "Which drugs raise IL-6?", "What is bone density?"]
    v = np.array([[1, 0, 0], [0.6, 0.8, 0], [0.999, 0.0447, 0], [0, 0, 1]], dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    kept, dropped = rc.dedup(ids, texts, v, threshold=0.95)
    assert kept == [0, 3] and dropped["q2"] == "exact q1" and dropped["q3"].startswith("near q1 0.99")
    kept, _ = rc.dedup(ids, texts, v, threshold=1.0)  # near-duplicate removal off: only the exact one goes
    assert kept == [0, 2, 3]


def test_near_duplicates_are_only_questions_of_the_same_logic():
    """Questions that differ by AND / OR or where a NOT sits embed almost alike (MiniLM: 0.998
    for "X and Y but not Z" against "X or Y but not Z") but have other gold sets: only a
    question of the same terms and truth table is a near duplicate; an exact copy of a text
    goes whatever its form."""
    forms = ['"a" AND "b" AND NOT "c"', '"a" OR "b" AND NOT "c"', 'NOT "c" AND ("B" AND "a")', '"x" AND "y"']
    keys = [rc.logic_key(f) for f in forms]
    assert keys[0] != keys[1] and keys[0] == keys[2] != keys[3]
    ids = ["g-0", "g-1", "g-2", "g-3"]
    texts = ["A and B, not C?", "A or B, not C?", "B and A, not C?", "A and B, not C?"]
    v = np.ones((4, 2)) / np.sqrt(2)  # every pair alike by its embedding
    kept, dropped = rc.dedup(ids, texts, v, threshold=0.95, forms=[keys[0], keys[1], keys[2], keys[3]])
    assert kept == [0, 1] and dropped["g-2"].startswith("near g-0 ") and dropped["g-3"] == "exact g-0"


def test_label_counts():
    c = rc.label_counts([0.05, 0.55, 0.95], [0, 1, 1], Counter({"q1": 2, "q2": 0}))
    assert c["relevant"] == 2 and c["p_true_histogram"]["0.9-1.0"] == 1 and c["relevant_per_question"]["questions_without_any"] == 1


def test_a_label_from_no_evidence_is_not_relevant_and_a_nan_is_refused():
    """Neither label's logit returned (or both masked) gives P(True) 0.5 from nothing, which
    the default threshold of 0.5 labelled relevant (written to the qrels); a NaN P(True) was
    labelled not relevant and left out of the card's histogram. The first is not relevant and
    counted on the card; the second refused, the pair named. An empty dataset has no question
    without a relevant document (it said one)."""
    inf = float("inf")
    assert rc.label(0.5, -3.0, -3.0, False, 0.5, "q1/d1") == 0  # (label_logits: neither label among the values returned)
    assert rc.label(0.5, -inf, -inf, True, 0.5, "q1/d1") == 0  # both masked
    assert rc.label(0.6, -1.0, -1.4, False, 0.5, "q1/d1") == 1  # one label bounded: still evidence, counted as inexact
    assert rc.label(0.5, 1.0, 1.0, True, 0.5, "q1/d1") == 1  # equal logits, both returned: the threshold says
    with pytest.raises(rc.GenerateError, match=r"^generate: the engine's P\(True\) is NaN for question 'q1', doc 'd1' .*nothing of"):
        rc.label(float("nan"), float("nan"), 0.0, True, 0.5, "question 'q1', doc 'd1'")
    c = rc.label_counts([0.5, 0.6, 0.9], [0, 1, 1], Counter({"q1": 2}), [False, False, True], [(-3.0, -3.0), (-1.0, -1.4), (-inf, -inf)])
    assert (c["inexact"], c["no_evidence"], c["relevant"]) == (2, 2, 2)
    empty = rc.label_counts([], [], Counter())
    assert empty["relevant_per_question"] == {"mean": 0.0, "min": 0, "max": 0, "questions_without_any": 0}


def test_the_dataset_digest_ignores_placement_but_not_what_changes_the_data():
    cfg = GenerateConfig(db="db")
    moved = cfg.model_copy(update={"wave_shards": 7, "ray": RayConfig(address="ray://x:10001"),
                                   "llm": LLMConfig(actors=4, batch_rows=8, cache=None), "demo_note": "demo"})
    assert moved.dataset_digest() == cfg.dataset_digest()
    assert cfg.model_copy(update={"seed": 1}).dataset_digest() != cfg.dataset_digest()
    assert cfg.model_copy(update={"llm": LLMConfig(max_model_len=1024)}).dataset_digest() != cfg.dataset_digest()
    with pytest.raises(ValueError, match="repeat"):
        GenerateConfig(db="db", candidates=("dense", "dense"))


def test_checkpoints_made_by_the_engine_on_another_device_are_not_resumed(monkeypatch):
    """``dtype: auto`` is float32 on a CPU and the GPU's own there, and the dataset digest keys
    it as written: a run stopped on one and resumed on the other kept the first's shards and
    went on at the other precision. The checkpoints' state keys the engine as it runs."""
    import types

    from logicrank.jobs.generate import checkpoints_state
    from logicrank.pipelines import torch_build

    cfg, store = GenerateConfig(db="db"), types.SimpleNamespace(version=3, version_made=lambda: "2026-12-06T00:00:00")
    monkeypatch.setattr(torch_build, "cpu_only", lambda: True)
    cpu = checkpoints_state(cfg, store, "m")
    monkeypatch.setattr(torch_build, "cpu_only", lambda: False)
    gpu = checkpoints_state(cfg, store, "m")
    assert cpu != gpu and cpu["dataset_digest"] == gpu["dataset_digest"]
    assert checkpoints_state(cfg.model_copy(update={"wave_shards": 7}), store, "m") == gpu  # placement: the same checkpoints


def test_the_llm_stages_shard_options_are_refused_where_generate_would_ignore_them():
    for llm in ({"wave_shards": 3}, {"shard_queries": 16}, {"wave_shards": 3, "shard_queries": 16}):
        with pytest.raises(ValueError, match=r"generate does not read llm\.(wave_shards|shard_queries).*: its shards are shard_docs"):
            GenerateConfig.model_validate({"db": "db", "llm": llm})
    whole = GenerateConfig(db="db", wave_shards=3)  # written out with every field set, it reads back
    assert GenerateConfig.model_validate_json(whole.model_dump_json()) == whole
    assert GenerateConfig.model_validate({"db": "db", "wave_shards": 3, "llm": {"actors": 2}}).wave_shards == 3


def test_a_last_shard_too_small_for_a_template_joins_the_one_before():
    from logicrank.pipelines.generate.realcorpus import shard

    ids = [f"d{i}" for i in range(10)]
    assert [len(s) for s in shard(ids, 4)] == [4, 6] and [len(s) for s in shard(ids[:9], 4)] == [4, 5]
    assert [len(s) for s in shard([*ids, "d10"], 4)] == [4, 4, 3] and sum(shard(ids, 4), []) == ids


def test_the_generate_commands_fail_in_one_line_on_user_mistakes(tmp_path):
    from typer.testing import CliRunner

    from logicrank.cli import app

    res = CliRunner().invoke(app, ["generate", "itlr", "--db", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--candidate", "foo"])
    assert res.exit_code == 2 and "--candidate 'foo': must be 'dense', 'bm25' or 'itlr'" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["generate", "itlr", "--db", str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "generate: no database at" in res.output and not (tmp_path / "o").exists()  # nothing claimed
    assert not (tmp_path / "none").exists()  # a mistyped --db is read, never created
    res = CliRunner().invoke(app, ["generate", "setlogic", "--out", str(tmp_path / "s"), "--per-template", "2"])
    assert res.exit_code == 0 and "14 queries" in res.output


def test_the_sample_is_the_one_a_sorted_list_of_every_id_gives():
    """The ids sorted and drawn in Arrow give the documents a Python list of every id gave (the
    sample a dataset was made from), whatever the ids' scripts and the table's batches."""
    import random as stdlib_random

    import pyarrow as pa

    rng = stdlib_random.Random(5)
    alphabet = "abcXYZ019-_éßжי中😀"
    ids = list({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(3000)})

    class Store:
        def scan(self, columns):
            for lo in range(0, len(ids), 700):
                yield pa.record_batch({"doc_id": ids[lo : lo + 700]})

    for seed, n in ((0, 4), (3, 50), (7, len(ids))):
        listed = sorted(stdlib_random.Random(f"generate:{seed}:docs").sample(sorted(ids), n))
        assert rc.sample_docs(Store(), n, seed) == listed
    with pytest.raises(rc.GenerateError, match="holds 3"):
        ids[:] = ids[:3]
        rc.sample_docs(Store(), 4, 0)
