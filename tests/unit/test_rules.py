"""SIAR and R3 without an LLM: the rule shape, the permutation parser (property tests), the
sliding windows, and the reranking loop driven by a scripted stand-in for the LLM."""

import re

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrank.pipelines.llm.engine import Generation
from logicrank.pipelines.retrieval.methods import rules


def gen(text: str, finish: str = "stop") -> Generation:
    return Generation(text, finish, prompt_tokens=10, cached_prompt_tokens=4, generated_tokens=5)


# ------------------------------------------------------------------------------ SIAR
def test_rule_regex_accepts_the_shape_within_its_word_bounds():
    rx = re.compile(rules.rule_regex(condition_words=6, conclusion_words=6))
    assert rx.fullmatch("If Person X owns Animal Y, then Person X can feed Animal Y.")
    assert rx.fullmatch("If Person X, and Y, then Z.")  # commas may sit inside the condition
    assert not rx.fullmatch("If Person X owns Animal Y then Person X can feed Animal Y.")  # no ", then"
    assert not rx.fullmatch("If a b c d e f g, then z.")  # 7 condition words > 6
    assert not rx.fullmatch("If a, then b c d e f g h.")  # 7 conclusion words > 6
    assert not rx.fullmatch("If a, then b. More.")  # one full stop, at the end


@pytest.mark.parametrize(
    ("text", "finish", "ok"),
    [
        ("If Person X owns Animal Y, then Person X can feed Animal Y.", "stop", True),
        ("  If Person X owns Animal Y, then Person X can feed Animal Y.\n", "stop", True),
        ("If Person X owns Animal Y, then Person X can feed", "length", False),  # cut at max_tokens
        ("Person X can feed Animal Y.", "stop", False),  # unconstrained and not the shape
        ("If Person X owns Animal Y, then Person X can feed Animal Y.\nQuery: and so on", "length", True),  # the first line is the rule
        ("If Person X owns Animal Y.", "stop", False),
        # an unconstrained model's explanation after its rule, on the same line, is not the rule
        ("If Person X owns Animal Y, then Person X can feed Animal Y. This holds since Maya owns Rex, so yes.", "stop", True),
    ],
)
def test_parse_rule(text, finish, ok):
    rule, why = rules.parse_rule(gen(text, finish))
    assert (rule is not None) is ok and (why is None) is ok
    assert rule is None or rule == "If Person X owns Animal Y, then Person X can feed Animal Y."


def test_a_full_stop_inside_a_word_does_not_end_a_rule():
    for rule in ("If Person X lives in the U.S., then Person X pays U.S.-federal taxes.", "If Item X weighs 2.5 kg, then Item X costs 3.5 dollars."):
        assert rules.parse_rule(gen(rule + " Because of the law.", "stop")) == (rule, None)


class ScriptedLLM:
    """Stands in for the job's LLM service: answers each prompt with ``answer(values)``."""

    model_id = "scripted@0"

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def generate(self, template, values, constraint=None, max_tokens=256, temperature=0.0, seed=None, label=None):
        self.calls.append((template.name, list(values), constraint, max_tokens))
        return [self.answer(v) for v in values]


def test_induce_keeps_every_row_and_rewrites_in_both_modes():
    outputs = {"q0": gen("If Person X owns Animal Y, then Person X can feed Animal Y."), "q1": gen("Alice feeds Tom."),
               "q2": RuntimeError("engine died")}
    llm = ScriptedLLM(lambda v: outputs[next(q for q, t in TEXTS.items() if rules.query_prompt_text(t) == v["query"])])
    induced = rules.induce(llm, list(TEXTS), list(TEXTS.values()), rules.SiarOptions())
    assert induced.column("status").to_pylist() == ["ok", "fallback", "error"]
    assert induced.column("rule").to_pylist()[1:] == [None, None]
    assert llm.calls[0][2].kind == "regex" and llm.calls[0][0] == rules.INDUCE_TEMPLATE
    queries = pa.table({"query_id": list(TEXTS), "text": list(TEXTS.values())})
    alone = rules.rewrite(queries, induced, "rule")
    both = rules.rewrite(queries, induced, "rule+query")
    assert alone.column("text").to_pylist() == ["If Person X owns Animal Y, then Person X can feed Animal Y.", TEXTS["q1"], TEXTS["q2"]]
    assert both.column("text").to_pylist()[0] == "If Person X owns Animal Y, then Person X can feed Animal Y.\n" + TEXTS["q0"]
    assert both.column("original_text").to_pylist() == list(TEXTS.values())
    assert both.column("induction_status").to_pylist() == ["ok", "fallback", "error"]
    # after an expansion (its reasoning the text, the question kept as original_text): the question stays the original
    expanded = queries.append_column("original_text", pa.array(["asked 0", "asked 1", "asked 2"])).set_column(
        1, "text", pa.array(["reasoning 0", "reasoning 1", "reasoning 2"]))
    assert rules.rewrite(expanded, induced, "rule").column("original_text").to_pylist() == ["asked 0", "asked 1", "asked 2"]


TEXTS = {"q0": "Alice owns a cat named Tom.\nCan Alice feed Tom?", "q1": "Bob has a laptop.\nDoes Bob use it?", "q2": "x"}


# ------------------------------------------------------------------------------ R3
@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from("[]> ,0123456789\n abc-"), max_size=200) | st.text(max_size=200), st.integers(1, 40))
def test_parse_permutation_never_fails_and_always_returns_a_permutation(text, n):
    perm, rep = rules.parse_permutation(text, n)
    assert sorted(perm) == list(range(n))
    ids = re.findall(r"\[(\d+)\]", text) or re.findall(r"\d+", text)  # the bracketed ones where there are any
    assert rep.missing == n - len({int(m) - 1 for m in ids if len(m.lstrip("0")) <= 6 and 0 < int(m) <= n})


@given(st.permutations(list(range(1, 21))))
def test_a_clean_output_is_read_as_written(order):
    perm, rep = rules.parse_permutation(" > ".join(f"[{i}]" for i in order), 20)
    assert perm == [i - 1 for i in order] and not rep.any


def test_parse_permutation_repairs():
    perm, rep = rules.parse_permutation("[3] > [1] > [3] > [9] > [0] > junk " + "9" * 5000, 4)
    assert perm == [2, 0, 1, 3]  # 3, 1, then the missing 2 and 4 in their previous order
    assert (rep.unknown, rep.duplicate, rep.missing) == (2, 1, 2)  # [9] and [0]; the unbracketed 99...9 is no identifier here
    # where any identifier is bracketed, the other numbers are the model's prose: a count, a list's numbering
    assert rules.parse_permutation("Here are the 3 rules ranked: [2] > [3] > [1]", 3) == ([1, 2, 0], rules.Repairs(0, 0, 0))
    assert rules.parse_permutation("1. [3]\n2. [1]\n3. [2]", 3) == ([2, 0, 1], rules.Repairs(0, 0, 0))
    assert rules.parse_permutation("3 then 1, 2", 3) == ([2, 0, 1], rules.Repairs(0, 0, 0))  # none bracketed: every number


def test_permutation_regex_holds_exactly_n_identifiers_from_1_to_n():
    rx = re.compile(rules.permutation_regex(12))
    assert rx.fullmatch(" > ".join(f"[{i}]" for i in range(12, 0, -1)))
    assert rx.fullmatch(" > ".join(["[1]"] * 12))  # repeats pass the regex; the parser drops them
    assert not rx.fullmatch(" > ".join(f"[{i}]" for i in range(1, 12)))  # 11
    assert not rx.fullmatch(" > ".join(f"[{i}]" for i in range(1, 13)).replace("[12]", "[13]"))


@pytest.mark.parametrize(
    ("n", "window", "stride", "spans"),
    [
        (20, 20, 10, [(0, 20)]),
        (100, 20, 10, [(80, 100), (70, 90), (60, 80), (50, 70), (40, 60), (30, 50), (20, 40), (10, 30), (0, 20)]),
        (25, 20, 10, [(5, 25), (0, 20)]),  # the front is always read, a full window (RankGPT's loop would stop after (5, 25))
        (21, 20, 20, [(1, 21), (0, 20)]),  # not a one-rule window at the top
        (7, 20, 10, [(0, 7)]),
        (0, 20, 10, []),
    ],
)
def test_windows_slide_back_to_front(n, window, stride, spans):
    assert rules.windows(n, window, stride) == spans


@given(st.integers(1, 300), st.integers(2, 40), st.data())
def test_windows_cover_every_position_and_end_at_the_front(n, window, data):
    stride = data.draw(st.integers(1, window))
    spans = rules.windows(n, window, stride)
    assert spans[0][1] == n and spans[-1] == (0, min(window, n))
    assert all(0 <= a < b <= n and b - a <= window for a, b in spans)
    assert set().union(*(range(a, b) for a, b in spans)) == set(range(n))


def _reverse(values):
    return gen(" > ".join(f"[{i}]" for i in range(int(values["n"]), 0, -1)))


def test_rerank_reverses_each_window_in_turn_and_keeps_the_tail():
    docs = [f"d{i}" for i in range(35)]
    llm = ScriptedLLM(_reverse)
    s = rules.R3Options(n=30, window=20, stride=10)
    out, table = rules.rerank(llm, {"q": "facts"}, {"q": docs}, {d: f"rule {d}" for d in docs}, s)
    # windows [10, 30) then [0, 20), each reversed
    once = docs[:10] + docs[10:30][::-1] + docs[30:]
    want = once[:20][::-1] + once[20:]
    assert out["q"] == want and out["q"][30:] == docs[30:]
    assert table.column("start").to_pylist() == [10, 0] and set(table.column("status").to_pylist()) == {"ok"}
    assert [c[3] for c in llm.calls] == [s.max_tokens(20)] * 2 and llm.calls[0][2].value == rules.permutation_regex(20)
    counts = rules.window_counts(table, 1)
    assert counts["windows"] == 2 and counts["per_query"]["prompt_tokens"] == 20 and counts["cached_prompt_tokens"] == 8


def test_rerank_batches_one_step_of_every_query_and_repairs_or_keeps_order():
    answers = {"qa": gen("[2] > [2] > [7]"), "qb": RuntimeError("lost")}
    llm = ScriptedLLM(lambda v: answers["qa" if v["query"] == "a" else "qb"])
    lists = {"qa": ["x", "y", "z"], "qb": ["u", "v"], "qc": ["w"]}  # qc: one rule, nothing to reorder
    out, table = rules.rerank(llm, {"qa": "a", "qb": "b", "qc": "c"}, lists, {}, rules.R3Options())
    assert out == {"qa": ["y", "x", "z"], "qb": ["u", "v"], "qc": ["w"]}
    assert table.column("status").to_pylist() == ["repaired", "error"] or table.column("status").to_pylist() == ["error", "repaired"]
    row = next(r for r in table.to_pylist() if r["query_id"] == "qa")
    assert (row["unknown"], row["duplicate"], row["missing"], row["permutation"]) == (1, 1, 2, [2, 1, 3])
    assert len(llm.calls) == 2  # one call per window size (3 and 2), both at step 0


def test_to_run_ranks_and_cuts():
    run = rules.to_run({"q1": ["a", "b", "c"], "q0": ["d"]}, k=2, method="r3", run_id="r3")
    assert run.column("query_id").to_pylist() == ["q0", "q1", "q1"]
    assert run.column("rank").to_pylist() == [1, 1, 2] and run.column("score").to_pylist() == [1.0, 3.0, 2.0]


# ------------------------------------------------------------------------------ reasoning with rules
class _Store:
    """The rule texts a reason stage reads (DocStore.rows_for's shape)."""

    def __init__(self, texts: dict[str, str]):
        self.texts = texts

    def rows_for(self, doc_ids, columns):
        return pa.table({"doc_id": list(doc_ids), "title": [""] * len(doc_ids), "text": [self.texts[d] for d in doc_ids]})


class _Answers:
    """An LLM that records its prompts and answers from a script (an exception: the engine failed on it)."""

    model_id = "scripted"

    def __init__(self, replies):
        self.replies, self.prompts = list(replies), []

    def generate(self, template, values, constraint=None, max_tokens=256, temperature=0.0, seed=None, label=None):
        self.prompts += [template.render(**v) for v in values]
        assert constraint.kind == "regex"  # one line, bounded in words
        return [self.replies.pop(0) for _ in values]


def _run(rows):
    from logicrank.schemas.tables import RUN

    return pa.Table.from_pylist([{"query_id": q, "doc_id": d, "rank": r, "score": 1.0 / r, "method": "m", "run_id": "m"} for q, d, r in rows], schema=RUN)


def test_reason_shows_the_runs_top_rules_and_writes_one_answer_per_query(tmp_path, monkeypatch):
    """The stage prompts with the top `rules` documents of the run (0: none), the question and
    instruction as the answers file gives them; the run passes through; an engine error is an
    empty answer, counted; a cut answer is kept, counted."""
    import json

    from logicrank.pipelines.retrieval.stages import rules as stage
    from logicrank.pipelines.retrieval.stages.base import Context
    from logicrank.pipelines.retrieval.stages.rules import Reason, ReasonError

    monkeypatch.setattr(stage.templates, "cut_to_tokens", lambda model, texts, budget: texts)  # no tokenizer here
    gold = tmp_path / "answers.jsonl"
    gold.write_text("".join(json.dumps({"query_id": q, "question": f"Context:\nfacts of {q}\nQuestion:\nwhy {q}?", "answers": ["x"],
                                        "instruction": "Giving a Context, please answer the Question."}) + "\n" for q in ("a", "b", "c")))
    queries = pa.table({"query_id": ["a", "b", "c"], "text": ["facts of a\nwhy a?", "facts of b\nwhy b?", "facts of c\nwhy c?"]})
    run = _run([("a", "r1", 1), ("a", "r2", 2), ("b", "r2", 1)])  # c: nothing retrieved
    store = _Store({"r1": "If X owns Y, then X can feed Y.", "r2": "If X works with Y, then X uses Y."})
    llm = _Answers([gen(" Alice can feed Tom. "), RuntimeError("engine died"), gen("cut off", "length")])
    ctx = Context(store=store, llm=lambda: llm)
    out = Reason(rules.ReasonOptions(rules=1, gold=str(gold))).run(ctx, queries, [run])
    assert out.run is run
    a = out.side["answers"].to_pylist()
    assert [(r["query_id"], r["answer"], r["status"], r["rule_ids"]) for r in a] == [
        ("a", "Alice can feed Tom.", "ok", ["r1"]), ("b", "", "error", ["r2"]), ("c", "cut off", "length", [])]
    assert llm.prompts[0] == ("Giving a Context, please answer the Question.\n\nRule: If X owns Y, then X can feed Y.\n\n"
                              "Context:\nfacts of a\nQuestion:\nwhy a?\nAnswer:")
    assert "Rule:" not in llm.prompts[2]  # c has no rule to show
    assert out.counts["by_status"] == {"ok": 1, "error": 1, "length": 1} and out.counts["with_rules"] == 2

    llm = _Answers([gen("no"), gen("no"), gen("no")])
    out = Reason(rules.ReasonOptions(rules=0)).run(Context(store=store, llm=lambda: llm), queries, [run])  # no rule, the query text
    assert all("Rule:" not in p for p in llm.prompts) and llm.prompts[0].startswith(rules.DEFAULT_INSTRUCTION + "\n\nfacts of a")
    with pytest.raises(ReasonError, match="no question for 1 query"):
        Reason(rules.ReasonOptions(gold=str(gold))).run(ctx, pa.table({"query_id": ["z"], "text": ["t"]}), [run])


def test_qrels_stage_is_each_querys_judged_documents_as_a_run(tmp_path):
    from logicrank.pipelines.retrieval.stages.retrievers import Qrels, QrelsOptions

    path = tmp_path / "qrels.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td3\t1\nq1\td1\t2\nq1\td9\t0\nq2\td2\t1\nq3\td4\t1\n")
    queries = pa.table({"query_id": ["q1", "q2"], "text": ["", ""]})
    run = Qrels(QrelsOptions(path=str(path))).run(None, queries, []).run
    assert [(r["query_id"], r["doc_id"], r["rank"]) for r in run.to_pylist()] == [("q1", "d1", 1), ("q1", "d3", 2), ("q2", "d2", 1)]
    run = Qrels(QrelsOptions(path=str(path), k=1)).run(None, queries, []).run
    assert [(r["query_id"], r["doc_id"]) for r in run.to_pylist()] == [("q1", "d1"), ("q2", "d2")]
    # documents of one relevance keep the file's order, and the run's TREC file ranks them so (old code: the same
    # score for both, so trec_eval read dC before dA, doc id descending)
    from logicrank.pipelines.io import read_run, write_trec_run

    path.write_text("query-id\tcorpus-id\tscore\nq1\tdA\t1\nq1\tdC\t1\nq1\tdB\t1\n")
    run = Qrels(QrelsOptions(path=str(path), k=2)).run(None, queries, []).run
    assert [(r["doc_id"], r["rank"]) for r in run.to_pylist()] == [("dA", 1), ("dC", 2)]
    back = read_run(write_trec_run(run, tmp_path / "qrels.trec"))
    assert back.column("doc_id").to_pylist() == ["dA", "dC"] and all(abs(s - 1.0) < 1e-6 for s in back.column("score").to_pylist())
