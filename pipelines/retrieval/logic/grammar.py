"""The logical query language's grammar, defined once.

    T -> U OR U | U        U -> V AND V | V        V -> NOT W | W        W -> "string" | ( T )

(ITLR, ACL 2025), with the binary rules read as n-ary chains. Precedence NOT > AND > OR;
parentheses override. Terms are double-quoted strings with backslash escapes (``\\"``
and ``\\\\``). Keywords are case-insensitive when parsing; generated queries use upper case.

:data:`RULES` is the single source: :func:`to_lark` feeds the parser, :func:`to_gbnf` feeds
grammar-constrained decoding (vLLM structured outputs), so every decoded query parses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ref:
    rule: str


@dataclass(frozen=True)
class Kw:
    word: str  # a keyword: case-insensitive in Lark, upper case in GBNF
    infix: bool = True  # spaced on both sides when generated; a prefix keyword only after


@dataclass(frozen=True)
class Lit:
    text: str  # punctuation


@dataclass(frozen=True)
class Term:
    """A double-quoted string with backslash escapes."""


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Star:
    item: object


# rule name -> body; the first rule is the start symbol.
RULES: dict[str, object] = {
    "or_expr": Seq((Ref("and_expr"), Star(Seq((Kw("OR"), Ref("and_expr")))))),
    "and_expr": Seq((Ref("not_expr"), Star(Seq((Kw("AND"), Ref("not_expr")))))),
    "not_expr": Alt((Seq((Kw("NOT", infix=False), Ref("atom"))), Ref("atom"))),
    "atom": Alt((Term(), Seq((Lit("("), Ref("or_expr"), Lit(")"))))),
}
START = next(iter(RULES))

# A term: any characters but an unescaped quote or backslash, or the escape pairs \" and \\
# (another backslash pair, "\x", is refused: its backslash would vanish), as the GBNF has it.
# The regex admits "" so the parser can name an empty term; the parser refuses a term whose
# text holds only BLANK characters, and the GBNF encodes the same rule (a non-blank character
# inside).
_TERM_REGEX = r'"(?:[^"\\]|\\["\\])*"'
BLANK = " \t\r\n"


def _lark(node) -> str:
    match node:
        case Ref(rule):
            return rule
        case Kw(word, _):
            return word
        case Lit(text):
            return f'"{text}"'
        case Term():
            return "TERM"
        case Seq(items):
            return " ".join(_lark(i) for i in items)
        case Alt(options):
            return "(" + " | ".join(_lark(o) for o in options) + ")"
        case Star(item):
            return f"({_lark(item)})*"
    raise TypeError(node)


def _keywords() -> list[Kw]:
    found: list[Kw] = []

    def walk(node) -> None:
        match node:
            case Kw(word, _) if word not in [k.word for k in found]:
                found.append(node)
            case Seq(items):
                for i in items:
                    walk(i)
            case Alt(options):
                for o in options:
                    walk(o)
            case Star(item):
                walk(item)

    for body in RULES.values():
        walk(body)
    return found


KEYWORDS = tuple(k.word for k in _keywords())  # AND, OR, NOT
INFIX = tuple(k.word for k in _keywords() if k.infix)  # AND, OR: between operands; NOT before one


def to_lark() -> str:
    """Lark grammar (LALR) of the language; rules are inlined where they pass one child on."""
    lines = [f"start: {START}"]
    lines += [f"?{name}: {_lark(body)}" for name, body in RULES.items()]
    lines += [f'{kw}: /\\b{kw.lower()}\\b/i' for kw in KEYWORDS]  # a whole word: "a" ANDNOT "b" is no query
    lines += [f"TERM: /{_TERM_REGEX}/", "%import common.WS", "%ignore WS"]
    return "\n".join(lines) + "\n"


def _gbnf(node) -> str:
    match node:
        case Ref(rule):
            return rule.replace("_", "-")
        case Kw(word, infix):
            return f'ws "{word}" ws' if infix else f'"{word}" ws'
        case Lit(text):
            return f'"{text}"'
        case Term():
            return "term"
        case Seq(items):
            return " ".join(_gbnf(i) for i in items)
        case Alt(options):
            return "(" + " | ".join(_gbnf(o) for o in options) + ")"
        case Star(item):
            return f"({_gbnf(item)})*"
    raise TypeError(node)


def to_gbnf(max_term_chars: int | None = None) -> str:
    """GBNF grammar (llama.cpp / xgrammar) for decoding: upper-case keywords, single spaces.

    Terms are unbounded by default (``char+``); the decoder's ``max_tokens`` bounds the
    output. ``max_term_chars`` bounds each term, at a price: xgrammar expands ``char{1,n}``
    into n states, and on SmolLM2 constrained decoding takes 60 s (n = 64) and 306 s
    (n = 200) against 23 s unbounded for the same 8 prompts (measured).
    """
    chars = "char+" if max_term_chars is None else f"char{{1,{max_term_chars}}}"
    lines = [f"root ::= {START.replace('_', '-')}"]
    lines += [f"{name.replace('_', '-')} ::= {_gbnf(body)}" for name, body in RULES.items()]
    lines += [
        f'term ::= "\\"" blank* solid {chars.replace("+", "*").replace("{1,", "{0,")} "\\""',
        'blank ::= [ \\t\\r]',
        'solid ::= [^"\\\\\\n \\t\\r] | "\\\\" ["\\\\]',
        'char ::= [^"\\\\\\n] | "\\\\" ["\\\\]',
        'ws ::= " "',
    ]
    return "\n".join(lines) + "\n"
