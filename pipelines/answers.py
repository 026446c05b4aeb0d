"""SQuAD's answer normalisation and what counts as no answer, one definition for the QA
measures (pipelines/evaluation/qa.py: EM, token F1, contain-match accuracy, where no answer
never matches) and for LAG's reading of a sub-answer (pipelines/retrieval/methods/lag.py:
"Unknown." is the model saying it cannot answer, never an answer filled into the next step)."""

from __future__ import annotations

import re

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


UNKNOWN = "unknown"  # the word LAG's prompts ask a model to write when the passages do not answer
# what a model writes for "unknown" other than that word (normalised: lower case, no punctuation, no articles)
NO_ANSWER = frozenset({
    UNKNOWN, "none given", "not known", "not mentioned", "not stated", "not specified", "not given", "not provided",
    "no answer", "no information", "not enough information", "insufficient information", "cannot be determined",
    "cannot determine", "cannot answer", "cannot be answered", "it is unknown", "answer is unknown", "passages do not say",
    "passages do not mention", "passages do not give answer", "passages do not give", "passages do not specify",
})


def is_no_answer(text: str) -> bool:
    """Whether ``text`` says there is no answer ("Unknown.", "Not mentioned", "N/A")."""
    return normalize_answer(text) in NO_ANSWER or str(text).strip().lower().rstrip(".") in ("n/a", "n.a")
