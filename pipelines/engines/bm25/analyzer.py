"""Text -> BM25 terms: the analyzer every BM25 path of the project uses, and the vocabulary.

The analyzer (:class:`Analyzer`) is LanceDB's full-text one: its simple tokenizer (split on
characters that are not alphanumeric), tokens of 40 bytes or more dropped, lower case, Snowball
English stemming, Lucene's English stop words (matched after stemming), ASCII folding, in that
order; checked token for token against LanceDB's on SciFact and RuleBench
(tests/integration/test_sparse.py).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Sequence

import regex

MAX_TOKEN_BYTES = 40  # LanceDB's max_token_length: tokens of this many UTF-8 bytes or more are dropped

# Lucene's English stop set (EnglishAnalyzer, also Pyserini's and bm25s's), not LanceDB's own
# English list of about 180 words, which drops "can", "has", "own", "from", ...: on
# RuleBench, where "X can feed Y" is the rule, that list costs 7 points of R@1.
ENGLISH_STOP_WORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with",
)
# the simple tokenizer's words: runs of Rust's alphanumeric characters (Alphabetic or Numeric,
# which keeps Devanagari's and Arabic's combining vowel signs inside words; Python's isalnum does not)
WORD = regex.compile(r"[\p{Alphabetic}\p{N}]+")
# the same words in ASCII text (its Alphabetic characters are the letters, its Numeric the
# digits), found faster by the standard library's engine
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+")


def split_words(text: str) -> list[str]:
    """A text's words, as the simple tokenizer splits it (:data:`WORD`)."""
    return _ASCII_WORD.findall(text) if text.isascii() else WORD.findall(text)


def _fold(token: str) -> str:
    """ASCII folding: each character with an ASCII form (é -> e, ß -> ss, ¼ -> 14) becomes it;
    the others (Greek, CJK, ...) stay."""
    if token.isascii():
        return token
    return "".join(_fold_char(c) for c in token)


@functools.cache
def _fold_char(c: str) -> str:
    special = {"ß": "ss", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "đ": "d", "Đ": "D",
               "ł": "l", "Ł": "L", "þ": "th", "Þ": "TH", "ð": "d", "Ð": "D", "ı": "i", "ħ": "h", "Ħ": "H"}
    if c in special:
        return special[c]
    ascii_part = "".join(x for x in unicodedata.normalize("NFKD", c) if x.isascii())
    return ascii_part or c


class Analyzer:
    """Text -> BM25 terms, as LanceDB's full-text index analyzes title and text (module doc).

    Words are memoised: a corpus repeats its words, so each distinct word is lowered,
    stemmed and folded once."""

    def __init__(self, stop_words: Iterable[str] = ENGLISH_STOP_WORDS):
        import Stemmer  # PyStemmer: the Snowball English stemmer LanceDB's analyzer uses

        self.stemmer = Stemmer.Stemmer("english")
        self._stem = self.stemmer.stemWord
        self._stop = frozenset(stop_words)
        self._memo: dict[str, str | None] = {}

    def _term(self, word: str) -> str | None:
        if len(word.encode()) >= MAX_TOKEN_BYTES:
            return None
        lowered = word.lower() if word.isascii() else "".join(c.lower() for c in word)  # per character, as Rust's char::to_lowercase
        stem = self._stem(lowered)
        return None if stem in self._stop else _fold(stem)

    def term(self, word: str) -> str | None:
        """One word's term (None: a stop word or a token too long), memoised."""
        memo = self._memo
        term = memo.get(word, 0)
        if term == 0:
            term = memo[word] = self._term(word)
            if len(memo) > 2_000_000:  # bounded on corpora with huge vocabularies
                memo.clear()
        return term

    def words(self, text: str | None) -> list[str]:
        """A text's words, each of which :meth:`term` makes a term or drops: ``self(text)`` is
        their terms, in order, the dropped ones left out."""
        return split_words(text) if text else []

    def __call__(self, text: str | None) -> list[str]:
        if not text:
            return []
        memo, out = self._memo, []
        for word in self.words(text):
            term = memo.get(word, 0)
            if term == 0:
                term = self.term(word)
            if term is not None:
                out.append(term)
        return out


# a text that each step of the analysis changes: the split, the long-token cut, lower case,
# stemming, the stop words, folding; in three scripts
_PROBE = ("The runners' X-ray: naïve CAFÉ Straße, Ōsaka ﬁne jumped 42nd caught flies under an old oak-tree "
          "नमस्ते दुनिया مرحبا " + "x" * (MAX_TOKEN_BYTES - 1) + " " + "y" * MAX_TOKEN_BYTES)


def analyzer_digest(analyze: Analyzer | None = None) -> str:
    """What an analyzer (default: the project's) makes of a text, as a saved index records it
    (storage.py): its stop words, its longest token, PyStemmer's version, the terms it makes
    of a probe text, this module's code and the Unicode and ``regex`` versions it reads. An index saved under another digest is rebuilt, never patched or searched
    with query terms this one makes."""
    if analyze is None:
        return _default_digest()
    import hashlib
    import importlib.metadata
    import json

    facts = [sorted(analyze._stop), MAX_TOKEN_BYTES, importlib.metadata.version("PyStemmer"), analyze(_PROBE), _code_digest(),
             unicodedata.unidata_version, importlib.metadata.version("regex")]
    return hashlib.sha256(json.dumps(facts, ensure_ascii=False).encode()).hexdigest()[:16]


@functools.cache
def _code_digest() -> str:
    """This module's code, docstrings and comments aside: an edit to the folding or the split
    that the probe text does not show (a letter folded that it lacks) makes another analyzer
    too; a patch of an index the old code analyzed would keep its terms beside the new ones."""
    import ast
    import hashlib
    import json
    from pathlib import Path

    from logicrank.pipelines.codedigest import code_definitions

    found = code_definitions(ast.parse(Path(__file__).read_text(encoding="utf-8")))
    return hashlib.sha256(json.dumps(sorted(found.items())).encode()).hexdigest()[:16]


@functools.cache
def _default_digest() -> str:
    return analyzer_digest(Analyzer())


@functools.cache
def default_analyzer() -> Analyzer:
    """The process's one analyzer with Lucene's English stop words (its memo shared)."""
    return Analyzer()


class Vocabulary:
    """term <-> id, growing as documents bring new terms (ids never change)."""

    def __init__(self, terms: Sequence[str] = ()):
        self.terms = list(terms)
        self.ids = {t: i for i, t in enumerate(self.terms)}

    def id(self, term: str) -> int:
        i = self.ids.get(term)
        if i is None:
            i = self.ids[term] = len(self.terms)
            self.terms.append(term)
        return i

    def __len__(self) -> int:
        return len(self.terms)
