"""Question-answering measures, named by strings like the retrieval measures (``EM``,
``TokenF1``, ``Acc``, ``Judge``; case-insensitive, no cutoff).

- ``EM``: exact match after SQuAD's answer normalisation (lower case, no punctuation, no
  articles a/an/the, single spaces), best over the gold answer and its aliases, and over two
  readings of an answer that opens with a reply word: as written, and without it ("Yes,
  Michael can prescribe antibiotics." states the gold "Michael can prescribe antibiotics.": a
  yes/no question answered by an instruct model, RuleBench ULogic's every record; the reply
  word itself is not judged, so "No, Michael can prescribe antibiotics." also matches);
- against a multiple-choice gold answer (an option letter, "b" or "(c)": RuleBench's deer and
  theoremQA), every measure but the judge scores the option the prediction chooses
  (:func:`chosen_option`), as SQuAD's normalisation would delete "a" as an article;
- ``TokenF1``: SQuAD's token F1 on the normalised texts, best over the gold answers and the
  two readings;
- ``Acc``: contain-match accuracy (LAG's and many RAG papers' "accuracy"): 1 when a
  normalised gold answer or alias is a substring of the normalised prediction, except that
  no answer ("unknown", "not mentioned": pipelines/answers.py) matches only a gold answer
  that is itself no answer: as a substring "unknown" holds the gold "no" of every yes/no
  question, and LAG writes it when it stops without an answer;
- ``Judge``: an LLM judge: one True/False truth prompt per question (``qa_judge`` template)
  through an LLM pool (the evaluate job starts one); 1 when P(True) > 0.5; a blank answer
  is 0 without a prompt. Needs an LLM (``logicrank evaluate --judge-llm``). A prompt the
  engine fails on fails the evaluation: no figure rather than one that counted it as wrong.

The rows are the retrieval metrics' (METRICS: run_id, query_id, measure, value, plus the
mean as query ``all``), so significance tests and reports apply unchanged. Every gold
question is evaluated: a question without a prediction (or with a blank one) scores 0, as a
query without results does in retrieval; predictions for questions the gold lacks are not
evaluated (counted).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.pipelines.answers import is_no_answer, normalize_answer
from logicrank.pipelines.files import read_jsonl
from logicrank.schemas.errors import UserError
from logicrank.schemas.tables import METRICS

AGGREGATE_QUERY_ID = "all"


class QAError(UserError, ValueError):
    """An unknown QA measure, or an answers or gold file that cannot be read."""


_OPTION = re.compile(r"\(?([a-e])\)?\.?", re.IGNORECASE)  # a multiple-choice gold answer: "b", "(c)", "D."
_ENDS = r"(?=\s*$|[):,]|\.(?![A-Za-z])|\s+[-\d])"  # what may follow a chosen letter: nothing, punctuation, or the option's number ("d 273.0")
_CHOICE_READERS = (
    re.compile(r"\s*\(?([a-e])" + _ENDS, re.IGNORECASE),  # the answer starts with its option: "b", "(b) ...", "B. ..."
    re.compile(r".*?\b(?:answer|option|choice)(?:\s+is)?\s*[:-]?\s*\(?([a-e])" + _ENDS, re.IGNORECASE | re.S),  # "The answer is d."
    re.compile(r".*?\(([a-e])\)", re.IGNORECASE | re.S),  # an option in brackets: "... so (b)"
    re.compile(r".*?(?<![\w'.])(A(?!\s+[a-z])|[B-E])(?![\w'])", re.S),  # a capital standing alone ("C is right"; "A cat": an article)
)


def option_letter(gold: str) -> str | None:
    """The option a multiple-choice gold answer names ("b", "(c)", "D."), lower case; None
    for any other answer."""
    m = _OPTION.fullmatch(gold.strip())
    return m.group(1).lower() if m else None


def chosen_option(prediction: str) -> str | None:
    """The option a prediction chooses, lower case, read by the first of these that matches:
    the answer starts with an option letter followed by nothing, punctuation or the option's
    number ("b", "(b) Polar bear", "B. ...", "d 273.0"; "A polar bear ..." does not choose a);
    a cue ("the answer is d", "Option: (c)"); a letter in brackets; a capital A-E standing
    alone (an "A" before a lower-case word is an article). None when it names none. SQuAD's normalisation cannot read such answers: it
    deletes "a" as an article."""
    for reader in _CHOICE_READERS:
        if m := reader.match(prediction):
            return m.group(1).lower()
    return None


def _option_match(prediction: str, gold: Sequence[str]) -> float | None:
    """1 or 0 when every gold answer is an option letter (the chosen option against them);
    None otherwise: the text measures apply."""
    letters = [option_letter(g) for g in gold]
    if not letters or None in letters:
        return None
    return float(chosen_option(prediction) in letters)


_REPLY = re.compile(r"\s*(?:yes|no)\s*[,.:;!]\s*(?=\S)", re.IGNORECASE)  # "Yes, ..." / "No. ..." before a statement


def readings(prediction: str) -> list[str]:
    """The answer as written and, when it opens with "Yes"/"No" and punctuation before more
    text, that text alone: the reply word answers the question, the statement after it is the
    answer a sentence-valued gold is compared with (a bare "Yes." is read as written only)."""
    m = _REPLY.match(prediction)
    return [prediction, prediction[m.end():]] if m else [prediction]


SCORINGS = ("hotpotqa", "squad")  # a gold file's ``scoring``: its set's official script; absent, logicrank's own (below)
_HOTPOT_SPECIAL = frozenset({"yes", "no", "noanswer"})


def _readings(prediction: str, scoring: str | None) -> list[str]:
    """:func:`readings` under logicrank's own scoring; the prediction as written under a set's
    official script (HotpotQA's and SQuAD's read no reply word off)."""
    return readings(prediction) if scoring is None else [prediction]


def exact_match(prediction: str, gold: Sequence[str], scoring: str | None = None) -> float:
    """SQuAD's exact match, best over the gold answers and the prediction's :func:`readings`
    (``scoring`` None; a set's official script reads the prediction as written); against a
    multiple-choice gold answer (an option letter), the option the prediction chooses
    (:func:`chosen_option`)."""
    if scoring is None and (option := _option_match(prediction, gold)) is not None:  # (no official script reads options)
        return option
    said = {normalize_answer(r) for r in _readings(prediction, scoring)}
    # a gold that normalises to nothing ("The") matches nothing under logicrank's own scoring; the official scripts compare
    # the two strings, so there a prediction that normalises to nothing too matches it
    return float(any(g in said for g in map(normalize_answer, gold) if g or scoring is not None))


def token_f1(prediction: str, gold: Sequence[str], scoring: str | None = None) -> float:
    """SQuAD's token F1 (multiset overlap of normalised tokens), best over the gold answers;
    against an option letter, the chosen option (0 or 1). ``scoring`` "hotpotqa": HotpotQA's
    script (hotpot_evaluate_v1.py), where a prediction or gold of yes, no or noanswer scores 0
    unless the two are equal ("Yes, they are." against "yes": 0, not 0.5)."""
    if scoring is None and (option := _option_match(prediction, gold)) is not None:
        return option
    best = 0.0
    for reading in _readings(prediction, scoring):
        said = normalize_answer(reading)
        p = said.split()
        for g in gold:
            truth = normalize_answer(g)
            if scoring == "hotpotqa" and (said in _HOTPOT_SPECIAL or truth in _HOTPOT_SPECIAL) and said != truth:
                continue
            t = truth.split()
            if scoring == "squad" and not (p and t):  # SQuAD v2's compute_f1, which MuSiQue's script uses: an empty side
                best = max(best, float(p == t))       # (an answer of articles only) scores whether both are empty
                continue
            common = sum((Counter(p) & Counter(t)).values())
            if common:
                precision, recall = common / len(p), common / len(t)
                best = max(best, 2 * precision * recall / (precision + recall))
    return best


def contain_match(prediction: str, gold: Sequence[str], scoring: str | None = None) -> float:
    """1 when a normalised gold answer (non-empty) occurs in the normalised prediction; a
    prediction that is no answer is matched only against gold answers that are no answer too
    ("No answer" never matches the gold "no"); against an option letter, the chosen option (a
    letter is a substring of most answers). The LAG paper's measure, whatever the ``scoring``."""
    if is_no_answer(prediction):  # matched against the gold answers that are themselves no answer only
        gold = [a for a in gold if is_no_answer(a)]
        if not gold:
            return 0.0
    if (option := _option_match(prediction, gold)) is not None:
        return option
    p = normalize_answer(prediction)
    return float(any((g := normalize_answer(a)) and g in p for a in gold))


@dataclass(frozen=True)
class _Spec:
    kernel: Callable[[str, Sequence[str]], float] | None  # None: the judge (needs the LLM)
    doc: str


REGISTRY: dict[str, _Spec] = {
    "EM": _Spec(exact_match, "exact match after SQuAD normalisation, best over the gold answer and aliases (a leading Yes/No reply read off "
                             "too, unless the gold names its set's script)"),
    "TokenF1": _Spec(token_f1, "SQuAD token F1, best over the gold answer and aliases (a leading Yes/No reply read off too, unless the "
                                "gold names its set's script: HotpotQA's scores a yes/no mismatch 0)"),
    "Acc": _Spec(contain_match, "contain-match accuracy: a gold answer or alias is a substring of the normalised prediction"),
    "Judge": _Spec(None, "LLM judge: P(True) > 0.5 on a True/False prompt (needs an LLM)"),
}
_BY_LOWER = {k.lower(): k for k in REGISTRY}


def parse_qa_measures(texts: Iterable[str]) -> list[str]:
    """Canonical names, repeats dropped; all bad names reported at once."""
    out, bad = [], []
    for t in texts:
        name = _BY_LOWER.get(str(t).strip().lower())
        if name is None:
            bad.append(repr(t))
        elif name not in out:
            out.append(name)
    if bad:
        raise QAError(f"unknown QA measure(s) {', '.join(bad)}; valid: {', '.join(REGISTRY)}.")
    return out


# ------------------------------------------------------------------------------ files
@dataclass(frozen=True)
class Gold:
    question: str | None
    answers: tuple[str, ...]
    scoring: str | None = None  # "hotpotqa", "squad": the set's official script; None: logicrank's (a Yes/No reply read off)


def read_gold(path: str | Path) -> dict[str, Gold]:
    """query_id -> gold answers from an answers file (JSONL: query_id, answers [answer,
    *aliases], optional question and scoring: :data:`SCORINGS`), as ``logicrank prepare-qa``
    writes it; a BEIR directory
    means its answers.jsonl."""
    path = Path(path)
    if path.is_dir():
        path = path / "answers.jsonl"
    if not path.is_file():
        raise QAError(f"gold answers: no file at {str(path)!r}; give the answers.jsonl that `logicrank prepare-qa` writes.")
    out = {}
    for n, obj in read_jsonl(path, "gold answers", QAError, "with query_id and answers"):
        try:
            qid, answers = str(obj["query_id"]), obj["answers"]
            if isinstance(answers, str):
                answers = [answers]
            if not answers or not all(isinstance(a, str) for a in answers):
                raise TypeError("answers must be a non-empty list of strings")
        except (KeyError, TypeError) as exc:
            raise QAError(f"gold answers {path}: line {n} is not a JSON object with query_id and answers ({exc}).") from None
        if qid in out:
            raise QAError(f"gold answers {path}: query {qid!r} appears twice.")
        if (scoring := obj.get("scoring")) is not None and scoring not in SCORINGS:
            raise QAError(f"gold answers {path}: line {n}: scoring {scoring!r} is not one of {', '.join(SCORINGS)} (or absent).")
        out[qid] = Gold(obj.get("question"), tuple(answers), scoring)
    if not out:
        raise QAError(f"gold answers {path}: no answers (the file is empty).")
    return out


def read_predictions(path: str | Path) -> dict[str, str]:
    """query_id -> predicted answer from an answers table (Parquet with query_id and answer,
    as the lag stage writes it) or JSONL lines {"query_id", "answer"}. A repeated query is refused."""
    path = Path(path)
    if not path.is_file():
        raise QAError(f"answers: no file at {str(path)!r}; give an answers table (answers/<run_id>.parquet) or JSONL.")
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            t = pq.read_table(path, columns=["query_id", "answer"])
        except (pa.ArrowInvalid, KeyError, OSError) as exc:
            raise QAError(f"answers {path}: not a Parquet table with query_id and answer ({str(exc).splitlines()[0]}).") from None
        # ids as the gold file's and JSONL's are read: strings (a Parquet column of integers matched none)
        pairs = [(None if q is None else str(q), a) for q, a in zip(t.column("query_id").to_pylist(), t.column("answer").to_pylist(), strict=True)]
    else:
        pairs = []
        for n, obj in read_jsonl(path, "answers", QAError, "with query_id and answer"):
            if "query_id" not in obj or "answer" not in obj:  # (an answer under another key read as blank: every question 0, none counted)
                raise QAError(f"answers {path}: line {n} is not a JSON object with query_id and answer.")
            pairs.append((None if obj["query_id"] is None else str(obj["query_id"]), obj["answer"]))
    out: dict[str, str] = {}
    for qid, answer in pairs:
        if qid is None:
            raise QAError(f"answers {path}: a row has no query_id; give each answer its question's id.")
        if qid in out:
            raise QAError(f"answers {path}: query {qid!r} has more than one answer; give one per question.")
        if answer is not None and not isinstance(answer, str):
            raise QAError(f"answers {path}: query {qid!r}: the answer {answer!r} is not a string; write answers as text.")
        out[qid] = answer or ""
    return out


# ------------------------------------------------------------------------------ evaluation
Judge = Callable[[Sequence[str], Sequence[Sequence[str]], Sequence[str]], np.ndarray]  # (questions, gold, predictions) -> 0/1


def evaluate_answers(predictions: dict[str, str], gold: dict[str, Gold], measures: Sequence[str], run_id: str, judge: Judge | None = None) -> pa.Table:
    """Per-question values of every QA measure plus the mean as query ``all`` (METRICS rows)."""
    names = parse_qa_measures(measures)
    if "Judge" in names and judge is None:
        raise QAError("the Judge measure needs an LLM; give one (logicrank evaluate --judge-llm MODEL) or drop Judge.")
    if AGGREGATE_QUERY_ID in gold:  # its rows would be taken for the mean's, as a qrels query so named would (core.run_metrics)
        raise QAError(f"gold answers: a question {AGGREGATE_QUERY_ID!r}, the name of the mean's row; "
                      "rename that question (in the gold answers and the answers).")
    ids = sorted(gold)
    preds = [predictions.get(q, "") for q in ids]
    frames = []
    for name in names:
        if name == "Judge":
            questions = [gold[q].question or "" for q in ids]
            values = np.asarray(judge(questions, [gold[q].answers for q in ids], preds), dtype=np.float64)
        else:
            kernel = REGISTRY[name].kernel
            values = np.array([kernel(p, gold[q].answers, gold[q].scoring) if p.strip() else 0.0 for q, p in zip(ids, preds, strict=True)],
                              dtype=np.float64)
        frames.append(pd.DataFrame({"query_id": ids, "measure": name, "value": values}))
        frames.append(pd.DataFrame({"query_id": [AGGREGATE_QUERY_ID], "measure": [name], "value": [float(values.mean()) if len(values) else 0.0]}))
    df = pd.concat(frames, ignore_index=True)
    df.insert(0, "run_id", run_id)
    return pa.Table.from_pandas(df, schema=METRICS, preserve_index=False)


def coverage(predictions: dict[str, str], gold: dict[str, Gold]) -> tuple[int, int]:
    """(gold questions without a prediction or with a blank one: they score 0, predictions
    for questions the gold lacks: not evaluated)."""
    return sum(not (predictions.get(q) or "").strip() for q in gold), len(predictions.keys() - gold.keys())


JUDGE_TEMPLATE = "qa_judge"


def llm_judge(llm) -> Judge:
    """The ``Judge`` measure on an LLM service (``.truth``): 1 when P(True) > 0.5 that the
    prediction answers the question as the gold answer does; a blank prediction is 0 without a prompt."""
    from logicrank.pipelines.llm import prompts

    template = prompts.load(JUDGE_TEMPLATE)

    def judge(questions, golds, predictions):
        asked = [i for i, p in enumerate(predictions) if p.strip()]
        values = [{"question": " ".join(questions[i].split()), "gold": " / ".join(golds[i]), "prediction": " ".join(predictions[i].split())} for i in asked]
        out = np.zeros(len(predictions))
        for i, t in zip(asked, llm.truth(template, values, label="judge") if values else [], strict=True):
            if isinstance(t, Exception):
                raise QAError(f"the LLM judge failed on question {i}: {type(t).__name__}: {t}")
            if t.p_true != t.p_true:  # NaN (a NaN logit: an overflow in the model) is no verdict, not "wrong"
                raise QAError(f"the LLM judge's P(True) is NaN on question {i} (an overflow in the model); no Judge figure is given.")
            out[i] = float(t.p_true > 0.5)
        return out

    return judge
