"""SQuAD's answer normalisation, one definition for the QA measures
(pipelines/evaluation/qa.py: EM, token F1, contain-match accuracy) and for LAG's reading of a
sub-answer (pipelines/retrieval/methods/lag.py: "Unknown." is the model saying it cannot
answer)."""

from __future__ import annotations

import re

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())
