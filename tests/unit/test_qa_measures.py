"""QA measures: SQuAD normalisation, EM, token F1, contain-match, the files they read, and
the rows they write (every gold question scored; a missing answer scores 0)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logicrank.pipelines.evaluation import qa


@pytest.mark.parametrize(("text", "norm"), [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  an   apple, a day ", "apple day"),
    ("G. Stanley Hall", "g stanley hall"),
    ("Theatre", "theatre"),  # "the" only as a word
])
def test_normalize_answer_is_squads(text, norm):
    assert qa.normalize_answer(text) == norm


def test_exact_match_token_f1_and_contain_match():
    gold = ["G. Stanley Hall", "Stanley Hall"]
    assert qa.exact_match("stanley hall", gold) == 1.0 and qa.exact_match("Hall", gold) == 0.0
    # SQuAD F1: "the first president was stanley hall" vs "stanley hall": 2 common of 5 predicted tokens (articles dropped)
    assert qa.token_f1("the first president was Stanley Hall", gold) == pytest.approx(2 * (2 / 5) * 1.0 / (2 / 5 + 1.0))
    assert qa.token_f1("nothing alike", gold) == 0.0
    assert qa.contain_match("It was G. Stanley Hall, in 1892.", gold) == 1.0
    assert qa.contain_match("Hall", gold) == 0.0
    assert qa.contain_match("anything", ["the"]) == 0.0  # a gold answer that normalises to nothing matches nothing
    # exact match: under logicrank's own scoring a gold that normalises to nothing matches nothing; the official scripts
    # (HotpotQA's, SQuAD's) compare the normalised strings, so there "A" matches "the", and F1 is 0 (no common token)
    assert qa.exact_match("A", ["the"]) == 0.0
    assert qa.exact_match("A", ["the"], "hotpotqa") == qa.exact_match("an", ["The"], "squad") == 1.0
    assert qa.exact_match("a cat", ["the"], "squad") == 0.0 and qa.token_f1("A", ["the"], "hotpotqa") == 0.0
    # MuSiQue's script (`scoring: squad`: SQuAD v2's compute_f1) scores an F1 with an empty side by whether both are empty
    assert qa.token_f1("A", ["the"], "squad") == 1.0 and qa.token_f1("a cat", ["the"], "squad") == 0.0
    # no answer never matches: as a substring, "unknown" holds "no", the gold of every other yes/no question
    for abstention in ("unknown", "Unknown.", "UNKNOWN", "Not mentioned", "N/A", "The passages do not say.",
                       # said at more length (a helper's audit): each counted correct on a gold "no" as a substring
                       "Not mentioned in the passages.", "The passages do not mention it.", "Unknown from the passages",
                       "I don't know", "Not enough info", "No information given", "There is no information in the passages."):
        assert qa.contain_match(abstention, ["no"]) == 0.0 and qa.contain_match(abstention, ["No", "Nothing"]) == 0.0, abstention
    # unless the gold is itself no answer (a True / False / Unknown set): then it is matched as any answer
    assert qa.contain_match("Unknown.", ["Unknown"]) == qa.contain_match("unknown", ["no", "unknown"]) == 1.0
    assert qa.contain_match("Not mentioned", ["unknown"]) == 0.0  # (another no-answer phrase is not the gold's text)
    assert qa.contain_match("Not mentioned", ["no", "unknown"]) == qa.contain_match("No answer", ["no", "unknown"]) == 0.0  # never via "no"
    assert qa.contain_match("No.", ["no"]) == qa.contain_match("no, it is unknown to him", ["no"]) == 1.0  # an answer that says no
    assert qa.contain_match("Unknown Pleasures", ["Unknown Pleasures"]) == qa.contain_match("Not Fade Away", ["not fade away"]) == 1.0  # titles
    for title in ("I Don't Know How to Love Him", "I Can't Say No", "I Cannot Answer That"):
        assert qa.contain_match(title, [title]) == 1.0, title


def test_an_answer_opening_with_yes_or_no_is_also_read_without_it():
    """What Qwen answered on RuleBench ULogic (issue 51): the reply word, then exactly the gold
    conclusion; EM was 0.0 in every row, the gold rule's included."""
    gold = ["Jennifer is not an artist of the 'Winged Victory'."]
    assert qa.exact_match("No, Jennifer is not an artist of the 'Winged Victory'.", gold) == 1.0
    assert qa.exact_match("Yes, Michael can prescribe Antibiotics.", ["Michael can prescribe Antibiotics."]) == 1.0
    assert qa.token_f1("Yes: Michael can prescribe Antibiotics", ["Michael can prescribe Antibiotics."]) == 1.0
    assert qa.exact_match("No, Jennifer is an artist.", gold) == 0.0  # the statement must still be the gold's
    assert qa.exact_match("Yes, because it is.", ["yes"]) == 0.0  # a yes/no gold: the reply with more text is no exact match
    assert qa.exact_match("Yes.", ["yes"]) == 1.0 and qa.exact_match("No", ["no"]) == 1.0  # as written
    assert qa.exact_match("Yesterday, Michael can prescribe Antibiotics.", ["Michael can prescribe Antibiotics."]) == 0.0
    assert qa.readings("No") == ["No"] and qa.readings("no, it is") == ["no, it is", "it is"]


def test_parse_qa_measures_is_case_insensitive_and_reports_every_bad_name():
    assert qa.parse_qa_measures(["em", "TOKENF1", "acc", "EM"]) == ["EM", "TokenF1", "Acc"]
    with pytest.raises(qa.QAError, match=r"'F1@10', 'bleu'.*valid: EM, TokenF1, Acc, Judge"):
        qa.parse_qa_measures(["EM", "F1@10", "bleu"])


def test_every_gold_question_is_scored_and_a_missing_answer_scores_zero():
    gold = {"q1": qa.Gold("Who?", ("Ann",)), "q2": qa.Gold("Where?", ("Paris",)), "q3": qa.Gold("When?", ("1900",))}
    preds = {"q1": "Ann", "q2": "", "extra": "x"}  # q2 blank, q3 missing, extra not in the gold
    t = qa.evaluate_answers(preds, gold, ["EM", "Acc"], "run")
    df = t.to_pandas()
    assert sorted(df[df.query_id != "all"].query_id.unique()) == ["q1", "q2", "q3"]
    assert df[(df.query_id == "all") & (df.measure == "EM")].value.item() == pytest.approx(1 / 3)
    assert qa.coverage(preds, gold) == (2, 1)  # q2 blank and q3 missing: both score 0, both counted


def test_a_gold_question_named_as_the_means_row_is_refused_before_anything_is_written(tmp_path):
    """A gold question ``all`` (the mean's row) gave two ``all`` rows per run: the significance
    table was computed from the other questions alone (means 0.0 and 1.0 where the runs' EMs
    were 0.5 and 1.0) and written, then the report crashed. Refused in one line, as a qrels
    query so named is."""
    from logicrank.jobs.evaluate import run_evaluate
    from logicrank.pipelines.config.settings import EvaluateConfig

    gold = {"all": qa.Gold("Capital of France?", ("paris",)), "q2": qa.Gold("Of Italy?", ("rome",))}
    with pytest.raises(qa.QAError, match="gold answers: a question 'all', the name of the mean's row"):
        qa.evaluate_answers({"all": "paris", "q2": "x"}, gold, ["EM"], "a")
    (tmp_path / "gold.jsonl").write_text("".join(json.dumps({"query_id": q, "answers": list(g.answers)}) + "\n" for q, g in gold.items()))
    for name, answers in (("a", ["paris", "x"]), ("b", ["paris", "rome"])):
        pq.write_table(pa.table({"query_id": ["all", "q2"], "answer": answers}), tmp_path / f"{name}.parquet")
    with pytest.raises(qa.QAError) as exc:
        run_evaluate(EvaluateConfig(answers=(str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")), gold=str(tmp_path / "gold.jsonl")),
                     tmp_path / "e")
    assert "\n" not in str(exc.value) and not list((tmp_path / "e").glob("*.parquet"))


def test_the_judge_needs_an_llm_and_uses_its_verdicts():
    gold = {"q1": qa.Gold("Who?", ("Ann",)), "q2": qa.Gold("Where?", ("Paris",))}
    with pytest.raises(qa.QAError, match="needs an LLM"):
        qa.evaluate_answers({"q1": "Ann"}, gold, ["Judge"], "run")
    seen = []

    def judge(questions, golds, predictions):
        seen.append((list(questions), list(predictions)))
        return np.array([1.0, 0.0])

    t = qa.evaluate_answers({"q1": "Ann", "q2": "Rome"}, gold, ["Judge"], "run", judge=judge).to_pandas()
    assert seen == [(["Who?", "Where?"], ["Ann", "Rome"])] and t[t.query_id == "all"].value.item() == 0.5


def test_llm_judge_asks_one_truth_prompt_per_non_blank_answer():
    class Truths:
        def __init__(self):
            self.values = []

        def truth(self, template, values, label=None, keys=None):
            self.values += values
            return [type("T", (), {"p_true": 0.9 if v["prediction"] == "Ann" else 0.2})() for v in values]

    llm = Truths()
    out = qa.llm_judge(llm)(["Who?", "Where?", "When?"], [("Ann",), ("Paris",), ("1900",)], ["Ann", "Rome", " "])
    assert list(out) == [1.0, 0.0, 0.0] and len(llm.values) == 2  # the blank answer is 0 without a prompt
    assert llm.values[0] == {"question": "Who?", "gold": "Ann", "prediction": "Ann"}


def test_a_nan_from_the_judge_is_refused_not_scored_wrong():
    """A NaN P(True) (a NaN logit: an overflow in the model) was read as "wrong", lowering the
    Judge figure without a word; it is refused, naming the question."""
    class NaNs:
        def truth(self, template, values, label=None, keys=None):
            return [type("T", (), {"p_true": float("nan")})() for _ in values]

    with pytest.raises(qa.QAError, match=r"^the LLM judge's P\(True\) is NaN on question 0 "):
        qa.llm_judge(NaNs())(["Who?"], [("Ann",)], ["Ann"])


def test_reading_gold_and_predictions(tmp_path):
    g = tmp_path / "answers.jsonl"
    g.write_text(json.dumps({"query_id": "q1", "answers": ["Ann", "Anne"], "question": "Who?"}) + "\n\n"
                 + json.dumps({"query_id": "q2", "answers": "Paris"}) + "\n")
    gold = qa.read_gold(tmp_path)  # a directory means its answers.jsonl
    assert gold == {"q1": qa.Gold("Who?", ("Ann", "Anne")), "q2": qa.Gold(None, ("Paris",))}
    g.write_text(json.dumps({"query_id": "q1", "answers": []}) + "\n")
    with pytest.raises(qa.QAError, match="line 1"):
        qa.read_gold(g)
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"query_id": ["q1", "q2"], "answer": ["Ann", None]}), p)
    assert qa.read_predictions(p) == {"q1": "Ann", "q2": ""}
    pq.write_table(pa.table({"query_id": ["q1", "q1"], "answer": ["Ann", "Bob"]}), p)
    with pytest.raises(qa.QAError, match="more than one answer"):
        qa.read_predictions(p)
    pq.write_table(pa.table({"query_id": [1, 2], "answer": ["Ann", "Paris"]}), p)  # integer ids: read as the gold's strings
    assert qa.read_predictions(p) == {"1": "Ann", "2": "Paris"}
    j = tmp_path / "a.jsonl"
    j.write_text(json.dumps({"query_id": "q1", "answer": "Ann"}) + "\nnot json\n")
    with pytest.raises(qa.QAError, match="line 2"):
        qa.read_predictions(j)
    j.write_text(json.dumps({"query_id": "q1", "answer": 1984}) + "\n")
    with pytest.raises(qa.QAError, match="not a string"):
        qa.read_predictions(j)
    # an answer under another key was read as blank (every question 0, none counted); a null id as the string 'None'
    j.write_text(json.dumps({"query_id": "q1", "prediction": "Ann"}) + "\n")
    with pytest.raises(qa.QAError, match="line 1 is not a JSON object with query_id and answer"):
        qa.read_predictions(j)
    j.write_text(json.dumps({"query_id": None, "answer": "Ann"}) + "\n")
    with pytest.raises(qa.QAError, match="a row has no query_id"):
        qa.read_predictions(j)


def test_evaluate_config_refuses_what_it_cannot_evaluate():
    from pydantic import ValidationError

    from logicrank.pipelines.config.settings import EvaluateConfig

    with pytest.raises(ValidationError, match="give runs"):
        EvaluateConfig()
    with pytest.raises(ValidationError, match="given without runs"):  # `evaluate RUN --answers ...`: the run was read as the qrels
        EvaluateConfig(qrels="runs/lag.parquet", answers=("a.parquet",), gold="g.jsonl")
    with pytest.raises(ValidationError, match="answers need gold"):
        EvaluateConfig(answers=("a.parquet",))
    with pytest.raises(ValidationError, match="at least 1"):
        EvaluateConfig(answers=("a.parquet",), gold="g.jsonl", qa_measures=())
    assert EvaluateConfig(answers=("a.parquet",), gold="g.jsonl").qrels is None


def test_the_evaluate_job_scores_answers_alone_or_beside_runs(tmp_path):
    from logicrank.jobs.evaluate import evaluation_notes, run_evaluate
    from logicrank.pipelines.config.settings import EvaluateConfig
    from logicrank.pipelines.evaluation.report import summary_frame

    gold = tmp_path / "answers.jsonl"
    gold.write_text("".join(json.dumps({"query_id": q, "answers": [a]}) + "\n" for q, a in (("q1", "Ann"), ("q2", "Paris"), ("q3", "1900"))))
    pq.write_table(pa.table({"query_id": ["q1", "q2"], "answer": ["Ann", "It is Paris"]}), tmp_path / "lag.parquet")
    pq.write_table(pa.table({"query_id": ["q1", "q2", "q3"], "answer": ["Bob", "Paris", "1900"]}), tmp_path / "rag.parquet")
    out = tmp_path / "e1"
    table = summary_frame(run_evaluate(EvaluateConfig(answers=(str(tmp_path / "lag.parquet"), str(tmp_path / "rag.parquet")), gold=str(gold)), out))
    assert table.loc["lag"].tolist() == pytest.approx([1 / 3, (1 + 2 * (1 / 3) * 1 / (1 / 3 + 1)) / 3, 2 / 3])  # EM, TokenF1, Acc
    assert table.loc["rag", "EM"] == pytest.approx(2 / 3)
    assert evaluation_notes(out) == ["answers lag: 1 gold question(s) without an answer or with a blank one; they score 0."]
    assert (out / "significance.parquet").is_file() and (out / "plots" / "per_query.png").is_file()
    # beside a run, with an answers-only baseline: the plot takes a measure the baseline has
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    pq.write_table(pa.table({"query_id": ["q1"], "doc_id": ["d1"], "rank": [1], "score": [1.0], "method": ["x"], "run_id": ["lag"]}), tmp_path / "run.parquet")
    mixed = summary_frame(run_evaluate(EvaluateConfig(qrels=str(tmp_path / "qrels.tsv"), runs=(str(tmp_path / "run.parquet"),), measures=("P@1",),
                                                      answers=(str(tmp_path / "lag.parquet"), str(tmp_path / "rag.parquet")), gold=str(gold),
                                                      baseline="rag"), tmp_path / "e2"))
    assert mixed.loc["lag", "P@1"] == 1.0 and np.isnan(mixed.loc["rag", "P@1"]) and mixed.loc["rag", "EM"] == pytest.approx(2 / 3)
    # the report prints "-" for the measure rag lacks (old code: "nan", read as a figure)
    (rag_row,) = [line for line in (tmp_path / "e2" / "report.md").read_text().splitlines() if line.startswith("| rag ")]
    assert "nan" not in rag_row.lower() and [c.strip() for c in rag_row.strip("|").split("|")][2] == "-", rag_row


@pytest.mark.parametrize(
    ("prediction", "gold", "want"),
    [
        ("b", "b", 1.0), ("B. Polar bears live in the Arctic.", "b", 1.0), ("(d) Kimberlite", "d", 1.0),
        ("The answer is C.", "c", 1.0), ("c", "(c)", 1.0),
        ("Because of C", "b", 0.0),  # the chosen option is C, not b (contain-match on text would say 1: "b" in "because")
        ("The", "a", 0.0), ("An", "a", 0.0),  # SQuAD's normalisation makes both "" and gold "a" "" too: a match
        ("none of them", "a", 0.0),
        ("A polar bear has thick fur.", "a", 0.0),  # an article, not option a
        ("The answer is d.", "d", 1.0), ("Answer: d 273.0", "d", 1.0), ("answer: (b)", "b", 1.0),  # theoremQA's lower-case options
        ("Vitamin D is needed, so the answer is (b)", "b", 1.0), ("E.g. the second one, (b)", "b", 1.0),  # a cue or brackets before a capital
        ("C is the right one", "c", 1.0),
    ],
)
def test_a_multiple_choice_gold_is_scored_by_the_option_the_answer_chooses(prediction, gold, want):
    """RuleBench's deer and theoremQA answer with an option letter: every text measure scores
    the option the prediction chooses."""
    from logicrank.pipelines.evaluation.qa import contain_match, exact_match, token_f1

    assert exact_match(prediction, [gold]) == contain_match(prediction, [gold]) == token_f1(prediction, [gold]) == want


def test_the_reports_first_line_counts_the_qrels_queries_and_the_gold_questions_apart():
    from logicrank.pipelines.evaluation.report import markdown_report
    from logicrank.schemas.tables import METRICS

    rows = [("a", q, "nDCG@10", 1.0) for q in ("q1", "q2", "all")] + [("a", q, "EM", 0.0) for q in ("g1", "g2", "g3", "g4", "g5", "all")]
    metrics = pa.Table.from_pylist([dict(zip(METRICS.names, r, strict=True)) for r in rows], schema=METRICS)
    assert markdown_report(metrics, None).splitlines()[2] == "1 run(s), 2 queries (the qrels' queries), 5 questions (the gold answers')."
    only = metrics.filter(pa.compute.equal(metrics.column("measure"), "nDCG@10"))
    assert markdown_report(only, None).splitlines()[2] == "1 run(s), 2 queries (the qrels' queries)."


def test_hotpotqa_and_musique_gold_are_scored_by_their_own_scripts():
    """HotpotQA's hotpot_evaluate_v1.py scores F1 0 where a prediction or the gold is yes, no
    or noanswer and the two differ, and neither it nor MuSiQue's SQuAD script reads a "Yes,"
    / "No," reply off: "Yes, they are." against "yes" scored F1 0.5 here, "No, Arthur's
    Magazine" EM 1. The converters mark each set's gold with its script (`scoring`)."""
    cases = [("Yes, they are.", ["yes"], 0.5, 0.0), ("no, not both", ["no"], 0.5, 0.0), ("yes", ["yes sir"], 2 / 3, 0.0),
             ("No, Arthur's Magazine", ["Arthur's Magazine"], 1.0, 0.8), ("yes", ["Yes"], 1.0, 1.0), ("the Eiffel tower", ["Eiffel Tower"], 1.0, 1.0)]
    for prediction, gold, own, hotpot in cases:
        assert qa.token_f1(prediction, gold) == pytest.approx(own), prediction
        assert qa.token_f1(prediction, gold, "hotpotqa") == pytest.approx(hotpot), prediction
    assert qa.exact_match("No, Arthur's Magazine", ["Arthur's Magazine"]) == 1.0  # logicrank's own: RuleBench's sentence gold
    assert qa.exact_match("No, Arthur's Magazine", ["Arthur's Magazine"], "hotpotqa") == 0.0
    assert qa.exact_match("No, Arthur's Magazine", ["Arthur's Magazine"], "squad") == 0.0
    assert qa.token_f1("no, not both", ["no"], "squad") == pytest.approx(0.5)  # SQuAD's F1 has no yes/no rule
    # no official script reads an option letter: "C" is a text answer there
    assert qa.exact_match("The C programming language", ["C"], "squad") == 0.0
    assert qa.token_f1("The C programming language", ["C"], "squad") == pytest.approx(0.5)


def test_the_gold_files_scoring_is_read_and_checked(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"query_id": "q1", "answers": ["yes"], "scoring": "hotpotqa"}\n{"query_id": "q2", "answers": ["Paris"]}\n')
    gold = qa.read_gold(path)
    assert gold["q1"].scoring == "hotpotqa" and gold["q2"].scoring is None
    got = qa.evaluate_answers({"q1": "Yes, it is.", "q2": "Yes, Paris."}, gold, ["TokenF1"], "r").to_pylist()
    assert {r["query_id"]: r["value"] for r in got} == pytest.approx({"q1": 0.0, "q2": 1.0, "all": 0.5})
    path.write_text('{"query_id": "q1", "answers": ["yes"], "scoring": "hotpot"}\n')
    with pytest.raises(qa.QAError, match=r"line 1: scoring 'hotpot' is not one of hotpotqa, squad"):
        qa.read_gold(path)
