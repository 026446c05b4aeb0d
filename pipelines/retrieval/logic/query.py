"""Logical queries: AST, parser and canonical printer.

    >>> q = parse('("dog" OR "cat" AND "mouse") AND NOT "giraffe"')
    >>> print(q)
    ("dog" OR "cat" AND "mouse") AND NOT "giraffe"
    >>> q.terms()
    ('dog', 'cat', 'mouse', 'giraffe')

A chain ``a AND b AND c`` is one n-ary node; explicit parentheses are kept as structure, so
``parse(str(q)) == q`` for every AST and ``str(parse(str(q))) == str(q)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from logicrank.pipelines.retrieval.logic.grammar import BLANK, INFIX, KEYWORDS, to_lark
from logicrank.schemas.errors import UserError


class Node:
    """Base of the AST. Nodes are immutable and hashable."""

    def terms(self) -> tuple[str, ...]:
        """Distinct term texts in first-appearance order."""
        out: dict[str, None] = {}
        _collect(self, out)
        return tuple(out)

    def negations(self) -> int:
        return _count_not(self)

    def __str__(self) -> str:
        return to_text(self)


@dataclass(frozen=True, repr=False)
class Term(Node):
    text: str

    def __repr__(self) -> str:
        return f"Term({self.text!r})"


@dataclass(frozen=True, repr=False)
class Not(Node):
    child: Node

    def __repr__(self) -> str:
        return f"Not({self.child!r})"


@dataclass(frozen=True, repr=False)
class _Nary(Node):
    children: tuple[Node, ...]

    def __post_init__(self):
        if len(self.children) < 2:
            raise ValueError(f"{type(self).__name__} needs at least two children")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.children))})"


class And(_Nary):
    """All children hold (a chain ``a AND b AND c`` is one node)."""


class Or(_Nary):
    """Some child holds."""


def _collect(node: Node, out: dict[str, None]) -> None:
    if isinstance(node, Term):
        out.setdefault(node.text, None)
    elif isinstance(node, Not):
        _collect(node.child, out)
    else:
        for c in node.children:  # type: ignore[attr-defined]
            _collect(c, out)


def _count_not(node: Node) -> int:
    if isinstance(node, Term):
        return 0
    if isinstance(node, Not):
        return 1 + _count_not(node.child)
    return sum(_count_not(c) for c in node.children)  # type: ignore[attr-defined]


# -- printing ------------------------------------------------------------------------------
def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unquote(token: str) -> str:
    body = token[1:-1]
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            out.append(body[i + 1])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def relabel(node: Node, names: dict[str, str]) -> Node:
    """The same formula with each term's text replaced by ``names[text]``."""
    if isinstance(node, Term):
        return Term(names[node.text])
    if isinstance(node, Not):
        return Not(relabel(node.child, names))
    return type(node)(tuple(relabel(c, names) for c in node.children))  # type: ignore[attr-defined]


def to_text(node: Node) -> str:
    """The canonical text: upper-case keywords, single spaces, only needed parentheses."""
    if isinstance(node, Term):
        return quote(node.text)
    if isinstance(node, Not):
        inner = to_text(node.child)
        return f"NOT {inner}" if isinstance(node.child, Term) else f"NOT ({inner})"
    if isinstance(node, And):
        # an And child in parentheses is a nested group, kept as such; Or binds looser
        return " AND ".join(f"({to_text(c)})" if isinstance(c, (And, Or)) else to_text(c) for c in node.children)
    if isinstance(node, Or):
        return " OR ".join(f"({to_text(c)})" if isinstance(c, Or) else to_text(c) for c in node.children)
    raise TypeError(f"not a query node: {node!r}")


# -- parsing -------------------------------------------------------------------------------
class QueryParseError(UserError, ValueError):
    """A logical query that does not parse; the message shows where, with a caret."""

    def __init__(self, query: str, position: int, expected: str):
        self.query, self.position, self.expected = query, position, expected
        line = query.replace("\n", " ")
        super().__init__(
            f"cannot parse logical query at position {position}: {expected}\n  {line}\n  {' ' * position}^"
        )


@cache
def _parser():
    from lark import Lark

    return Lark(to_lark(), parser="lalr", maybe_placeholders=False)


def _build(tree, query: str) -> Node:
    from lark import Token

    if isinstance(tree, Token):
        text = unquote(str(tree))
        if not text.strip(BLANK):
            raise QueryParseError(query, tree.start_pos or 0, "an empty term; a term holds at least one non-blank character")
        return Term(text)
    kids = [c for c in tree.children if not (isinstance(c, Token) and c.type in ("AND", "OR", "NOT"))]
    if tree.data == "start":
        return _build(kids[0], query)
    if tree.data == "not_expr":
        return Not(_build(kids[0], query))
    if tree.data == "atom":  # "(" or_expr ")": the parenthesised group itself
        return _build(kids[0], query)
    nodes = tuple(_build(k, query) for k in kids)
    return And(nodes) if tree.data == "and_expr" else Or(nodes)


_TYPOGRAPHIC = "“”„‟«»″＂"  # quotes a term may be typed with; only the straight one delimits it
_HINTS = {'"': " (an unterminated quoted term?)", "'": " (terms take double quotes, not single)", "-": " (negate with NOT, not '-')",
          **dict.fromkeys(_TYPOGRAPHIC, " (terms take straight double quotes, not typographic ones)")}
_NAMES = {"LPAR": "'('", "RPAR": "')'", "TERM": "a quoted term", "AND": "AND", "OR": "OR", "NOT": "NOT"}


def parse(query: str) -> Node:
    """Parse a logical query; raises :class:`QueryParseError` naming the position."""
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

    if not isinstance(query, str):
        raise TypeError(f"a logical query is a string, not {type(query).__name__}")
    try:
        tree = _parser().parse(query)
    except UnexpectedToken as exc:
        if exc.token.type == "$END":
            raise QueryParseError(query, len(query), "the query ends too early") from None
        expected = ", ".join(sorted(_NAMES.get(t, t) for t in exc.expected)) or "something else"
        raise QueryParseError(query, exc.pos_in_stream or 0, f"unexpected {str(exc.token)!r}; expected {expected}") from None
    except UnexpectedCharacters as exc:
        ch = query[exc.pos_in_stream] if exc.pos_in_stream < len(query) else ""
        hint = " (terms must be double-quoted)" if ch.isalnum() else _HINTS.get(ch, "")
        raise QueryParseError(query, exc.pos_in_stream, f"unexpected character {ch!r}{hint}") from None
    except UnexpectedEOF:
        raise QueryParseError(query, len(query), "the query ends too early") from None
    except UnexpectedInput as exc:  # any other lark input error
        raise QueryParseError(query, getattr(exc, "pos_in_stream", 0) or 0, str(exc).splitlines()[0]) from None
    try:
        node = _build(tree, query)
    except RecursionError:
        raise QueryParseError(query, 0, "the query nests groups too deeply (hundreds of parentheses or NOTs)") from None
    if found := next((m for t in node.terms() if (m := _KEYWORD_IN_TERM.search(t))), None):
        # "vitamin D” AND NOT “bone": typographic quotes inside straight ones make the whole formula one term
        at = query.find(found.group(0))
        raise QueryParseError(query, max(at, 0), f"a term holds {found.group(0)!r}: typographic quotes delimit no term, so the "
                                                 "operator is read as words of one term; type straight double quotes")
    return node


# a closing typographic quote (double or single), an operator, an opening one: a formula typed with curly quotes inside
# straight ones. AND and OR in capitals only (a title may hold “yes” or “no”); a NOT in any case, whose loss would
# invert the query (so a title holding “is” not “ought” is refused too: type it with escaped straight quotes)
_KEYWORD_IN_TERM = re.compile(f"[{_TYPOGRAPHIC}’]\\s+(?:(?:AND|OR)\\s+(?:NOT\\s+)?|NOT\\s+)\\(*\\s*[{_TYPOGRAPHIC}‘]"
                              f"|(?i:[{_TYPOGRAPHIC}’]\\s+(?:(?:and|or)\\s+)?not\\s+\\(*\\s*[{_TYPOGRAPHIC}‘])")


_QUOTES = '"' + _TYPOGRAPHIC
_MINUS_QUOTE = re.compile(f"-\\s*[{_QUOTES}]")
_PREFIX = [k for k in KEYWORDS if k not in INFIX]
_UPPER_KEYWORD = re.compile(r"\S\s+(?:" + "|".join(INFIX) + r")\s+\S|(?<!\w)(?:" + "|".join(_PREFIX) + r")\s+\S")
_TERM = "\x00"  # a quoted span's stand-in among the words outside quotes
_JOINED = re.compile("T[kpc]*k[kpc]*T")  # a keyword, maybe with parentheses or "but", between two quoted terms
_CONNECTIVES = ("but", "except")  # words that join an exclusion to what it excludes ("a" but not "b")


def _outside_quotes(text: str) -> tuple[str, bool]:
    """``text`` with each quoted span (straight or typographic quotes) replaced by ``_TERM``, and
    whether a quote is left open. A quote mark right after a digit while none is open is an inch
    mark (``a 15" screen``), not a quote; one closing a span is a quote (``"vitamin D3"``)."""
    out, opened = [], False
    for i, ch in enumerate(text):
        if ch in _QUOTES and (opened or not (i and text[i - 1].isdigit())):
            if opened:
                out.append(f" {_TERM} ")
            opened = not opened
        elif not opened:
            out.append(ch)
    return "".join(out), opened


def looks_logical(text: str) -> bool:
    """Whether a free string (a notebook's one query) was meant as a logical query, so that one
    that does not :func:`parse` is refused rather than searched as plain words. It was when

    - a quote is left open (``"vitamin D" AND NOT "bone``; straight or typographic quotes; a
      quote right after a digit is an inch mark, ``a 15" screen``), or a minus precedes a quote
      (``-"bone"``);
    - AND, OR or NOT in any case sits between two quoted terms, parentheses and "but" or
      "except" allowed (``"vitamin D" and not "bone" health``, ``"a" and ("b" or c)``,
      ``"vitamin D" but not "bone"``), or every word outside the quotes is a keyword or
      parenthesis (``and not "bone"``);
    - an upper-case AND or OR sits between words or NOT before one, in a text that has lower
      case or a quoted term (``vitamin D AND NOT bone``, ``'vitamin D' AND NOT 'bone'``).

    Plain words stay plain words: ``vitamin D and bone health``, ``effects of "intermittent
    fasting" and weight loss``, ``is "long covid" not real``, ``VITAMIN D AND BONE``."""
    outside, unterminated = _outside_quotes(text)
    if unterminated or _MINUS_QUOTE.search(text):
        return True
    words = outside.replace("(", " ( ").replace(")", " ) ").split()
    kinds = "".join("T" if w == _TERM else "p" if w in ("(", ")") else "k" if w.upper() in KEYWORDS else "c" if w.lower() in _CONNECTIVES
                    else "w" for w in words)
    if "T" in kinds and (_JOINED.search(kinds) or ("k" in kinds and "w" not in kinds)):
        return True
    return ("T" in kinds or any(c.islower() for c in text)) and bool(_UPPER_KEYWORD.search(outside))


def positive_terms(node: Node, negated: bool = False) -> set[str]:
    """Terms that appear at least once under an even number of NOTs."""
    if isinstance(node, Term):
        return set() if negated else {node.text}
    if isinstance(node, Not):
        return positive_terms(node.child, not negated)
    return set().union(*(positive_terms(c, negated) for c in node.children))  # type: ignore[attr-defined]


def negated_terms(node: Node) -> set[str]:
    """Terms that appear at least once under an odd number of NOTs (``NOT (NOT "x")`` negates nothing)."""
    return positive_terms(node, negated=True)


def holds(node: Node, present: set[str]) -> bool:
    """Crisp truth of the query for a document containing exactly the terms in ``present``."""
    if isinstance(node, Term):
        return node.text in present
    if isinstance(node, Not):
        return not holds(node.child, present)
    if isinstance(node, And):
        return all(holds(c, present) for c in node.children)
    return any(holds(c, present) for c in node.children)  # type: ignore[attr-defined]


# -- refusing what does not parse ----------------------------------------------------------
class UnparsedQueryError(UserError, ValueError):
    """Queries whose logical query does not parse, refused by the stage that would score them."""


def unparsed_message(stage: str, unparsed: list[tuple[str, str, str]], hint: str = "",
                     what: tuple[str, str] = ("logical query", "logical queries")) -> str:
    """One line naming the first few queries whose logical query does not parse, and why the
    first does. ``unparsed``: (query id, the text that does not parse, the parse error's first
    line); ``what``: the thing that does not parse, singular and plural."""
    qid, text, error = unparsed[0]
    shown = text if len(text) <= 60 else text[:57] + "..."
    why = f"{shown!r} does not parse {error.removeprefix('cannot parse logical query ')}"
    if len(unparsed) == 1:
        head = f"{stage}: query {qid}'s {what[0]} {why}"
    else:
        ids = ", ".join(q for q, _, _ in unparsed[:5]) + (f" and {len(unparsed) - 5} more" if len(unparsed) > 5 else "")
        head = f"{stage}: {len(unparsed)} queries' {what[1]} do not parse ({ids}); {qid}'s {why}"
    return head + (f". {hint}." if hint else ".")
