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


# who says it cannot be told, and what may follow: a reason or a source (normalised: no articles, no punctuation)
_WHO = r"i |we |it |this |that |answer |question "
_WHY = (r"(?: (?:because|as|since|from|based on|with|without|given|in|using|according to|due to|for|passages?|context|text|"
        r"documents?|information|no|not|there|answer|question|who|what|when|where|which|whom|whose|how|this|that|it)\b.*)?")
# the same said at more length (normalised): "Not mentioned in the passages.", "The passages do not mention it.",
# "Unknown from the passages", "I don't know"; whole sentences of saying so, never a title that opens with such a word
_NO_ANSWER_SAID = re.compile(
    r"(?:it is |this is |answer is )?(?:unknown|not known|not mentioned|not stated|not specified|not given|not provided)"
    r"(?: (?:in|from|by|based on|according to|given) (?:provided |given )?(?:passages?|context|text|documents?|information)(?: provided| given)?)?"
    r"|(?:passages?|context|text|documents?) (?:(?:do|does|did) not|dont|doesnt|didnt) (?:say|mention|give|specify|state|contain|provide|answer)\b.*"
    r"|i (?:do not|dont|cannot|cant) (?:know|say|answer|tell)(?: (?:from|based on|in) (?:passages?|context|text|documents?))?"
    r"|(?:there is )?(?:no|not enough|insufficient) (?:information|info|answer)(?: (?:given|provided|available|in (?:passages?|context)))?"
    r"(?: to (?:answer|determine|tell)\b.*| to (?:this |that )?question| about\b.*)?"
    # "cannot be determined ..." and "cannot be answered ..." with a reason or a source after (never an answer given
    # after all: "Cannot be determined, but probably 1965"; nor a title: "Cannot Answer Back")
    rf"|(?:{_WHO})?(?:cannot|can not|cant) (?:be (?:determined|answered)|determined?){_WHY}"
    rf"|(?:{_WHO})?(?:cannot|can not|cant) answer(?: (?:that|this|it))?(?: question)?{_WHY}"
    r"|(?:it is )?impossible to (?:determine|answer|tell|say)\b.*")
# typographic apostrophes (I don’t know) read as the ASCII one, which the normalisation drops
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})


def is_no_answer(text: str) -> bool:
    """Whether ``text`` says there is no answer ("Unknown.", "Not mentioned in the passages.",
    "I don't know", "N/A"); an answer that holds such a word ("The Unknown Soldier") is one."""
    said = normalize_answer(str(text).translate(_APOSTROPHES))
    return said in NO_ANSWER or _NO_ANSWER_SAID.fullmatch(said) is not None or str(text).strip().lower().rstrip(".") in ("n/a", "n.a")
