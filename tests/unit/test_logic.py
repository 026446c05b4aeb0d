import doctest
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import logicrank.pipelines.retrieval.logic.fuzzy as fuzzy_mod
import logicrank.pipelines.retrieval.logic.query as query_mod
from logicrank.pipelines.retrieval.logic.fuzzy import OperatorError, Operators, compile_query
from logicrank.pipelines.retrieval.logic.grammar import BLANK, to_gbnf, to_lark
from logicrank.pipelines.retrieval.logic.query import And, Not, Or, QueryParseError, Term, parse, to_text

# -- AST strategies -------------------------------------------------------------------------
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(lambda t: t.strip(BLANK))
_terms = st.builds(Term, _text)


def _extend(children):
    group = st.lists(children, min_size=2, max_size=4).map(tuple)
    return st.one_of(st.builds(Not, children), st.builds(And, group), st.builds(Or, group))


asts = st.recursive(_terms, _extend, max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(asts)
def test_random_asts_round_trip_and_print_is_a_fixed_point(ast):
    text = to_text(ast)
    assert parse(text) == ast
    assert to_text(parse(text)) == text


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet='"\\()ANDORNOTandornot xy\n\t', max_size=40) | st.text(max_size=40))
def test_random_strings_parse_or_raise_the_parse_error(s):
    try:
        ast = parse(s)
    except QueryParseError as exc:
        assert 0 <= exc.position <= len(s)
        assert "^" in str(exc)
    else:
        assert to_text(parse(to_text(ast))) == to_text(ast)


def test_precedence_chains_case_and_escapes():
    assert parse('"a" OR "b" AND NOT "c"') == Or((Term("a"), And((Term("b"), Not(Term("c"))))))
    assert parse('"a" and "b" AND "c"') == And((Term("a"), Term("b"), Term("c")))
    assert parse('("a" OR "b") AND "c"') == And((Or((Term("a"), Term("b"))), Term("c")))
    assert parse('not ("a" or "b")') == Not(Or((Term("a"), Term("b"))))
    assert parse(r'"say \"hi\" \\ bye"') == Term('say "hi" \\ bye')
    assert to_text(parse('  "x"   or("y")  ')) == '"x" OR "y"'
    assert parse('"a"AND NOT("b")') == And((Term("a"), Not(Term("b"))))  # a keyword beside a quote or a bracket is a whole word


@pytest.mark.parametrize(
    "bad, position, words",
    [
        ('"a" AND', 7, "ends too early"),
        ('dog AND "x"', 0, "double-quoted"),
        ('"a" OR OR "b"', 7, "expected"),
        ('NOT NOT "a"', 4, "a quoted term"),
        ('"a" "b"', 4, "unexpected"),
        ('"a" ANDNOT "b"', 4, "double-quoted"),  # a keyword is a whole word: glued ones were read as AND NOT
        ('"a" ORNOT "b"', 4, "double-quoted"),
    ],
)
def test_parse_errors_name_the_position_with_a_caret(bad, position, words):
    with pytest.raises(QueryParseError) as exc:
        parse(bad)
    assert exc.value.position == position and words in str(exc.value)
    caret_line = str(exc.value).splitlines()[-1]
    assert caret_line.index("^") == 2 + position


def test_both_grammars_come_from_one_source():
    lark, gbnf = to_lark(), to_gbnf()
    for rule in ("or_expr", "and_expr", "not_expr", "atom"):
        assert f"?{rule}:" in lark and f"{rule.replace('_', '-')} ::=" in gbnf
    assert '"NOT" ws atom' in gbnf and 'ws "AND" ws' in gbnf


# -- composition ----------------------------------------------------------------------------
def test_worked_example_from_the_paper():
    q = parse('("dog" OR "cat" AND "mouse") AND NOT "giraffe"')
    rng = np.random.default_rng(0)
    S = rng.uniform(0, 1, (50, 4))
    dog, cat, mouse, giraffe = S.T
    got = compile_query(q, ["dog", "cat", "mouse", "giraffe"], Operators())(S)
    np.testing.assert_allclose(got, (dog + cat * mouse) * (1 - giraffe))


def test_families_by_name():
    q = parse('"a" AND "b" OR NOT "c"')
    S = np.array([[0.2, 0.5, 0.4]])
    cases = {
        "": 0.2 * 0.5 + (1 - 0.4),
        "and=min,or=max": max(min(0.2, 0.5), 0.6),
        "and=sum,or=prob,not=reciprocal": 1 - (1 - 0.7) * (1 - 1 / 0.4),
    }
    for spec, expected in cases.items():
        assert compile_query(q, ["a", "b", "c"], Operators.parse(spec))(S)[0] == pytest.approx(expected)
    assert len(Operators.grid()) == 3 * 3 * 2
    assert str(Operators.parse("or=max")) == "and=product,or=max,not=complement"


def test_unknown_family_lists_the_valid_ones():
    with pytest.raises(OperatorError, match="unknown and family 'mean'; valid: product, sum, min"):
        Operators.parse("and=mean")
    with pytest.raises(OperatorError, match="op=family"):
        Operators.parse("xor=sum")
    with pytest.raises(ValueError, match="no score column"):
        compile_query(parse('"a"'), ["b"], Operators())


def test_module_doctests():
    for mod in (query_mod, fuzzy_mod):
        result = doctest.testmod(mod)
        assert result.failed == 0 and result.attempted > 0, (mod.__name__, result)


# -- the decoding grammar (GBNF) against the parser -------------------------------------------
_gen_terms = st.builds(
    Term, st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(lambda t: t.strip(BLANK))
)
gen_asts = st.recursive(_gen_terms, _extend, max_leaves=10)


@pytest.fixture(scope="module")
def gbnf():
    import xgrammar as xg
    from xgrammar.testing import _is_grammar_accept_string  # xgrammar's own acceptance check

    grammar = xg.Grammar.from_ebnf(to_gbnf())
    return lambda s: _is_grammar_accept_string(grammar, s)


@settings(max_examples=200, deadline=None)
@given(gen_asts)
def test_what_the_parser_prints_the_decoder_grammar_accepts(gbnf, ast):
    assert gbnf(to_text(ast))


def test_every_string_the_decoder_grammar_accepts_parses(gbnf):
    """Every string of one to four of the query language's tokens (most are not queries): each
    one the decoder's grammar accepts parses, and among them are terms joined by AND and by OR
    (random characters were accepted about once in 400, and a bare term says little)."""
    import itertools

    tokens = ['"x"', '"y z"', ' AND ', ' OR ', 'NOT ', '(', ')', ' ', '"']
    joined = Counter()
    for n in range(1, 5):
        for parts in itertools.product(tokens, repeat=n):
            s = "".join(parts)
            if gbnf(s):
                joined[type(parse(s)).__name__] += 1  # parse raises if not
    assert joined["And"] >= 10 and joined["Or"] >= 10, joined


def test_decoder_grammar_examples(gbnf):
    for ok in ['"a" AND NOT "b"', '("a" OR "b") AND "c"', r'"x\"y" OR "z"', 'NOT ("a" AND "b")']:
        assert gbnf(ok), ok
    for bad in ['"a" AND', "dog", 'NOT NOT "a"', '""', '" "', '"a" OR "\t "', '"a" and "b"']:  # generated keywords are upper case
        assert not gbnf(bad), bad


@pytest.mark.parametrize(("query", "position"), [('"" AND ""', 0), ('"a" OR "  "', 7), ('NOT ("x" AND "\t")', 13)])
def test_an_empty_or_blank_term_is_a_parse_error(query, position):
    with pytest.raises(QueryParseError, match="an empty term") as exc:
        parse(query)
    assert exc.value.position == position


def test_a_term_keeps_every_character_it_was_given_or_is_refused(gbnf):
    r"""Only \" and \\ are escapes, in the parser as in the decoding grammar: another backslash
    pair ("C:\new") is refused by both, never read with its backslash gone."""
    assert parse(r'"a \"b\" \\ c"') == Term('a "b" \\ c')
    for query in (r'"C:\new"', r'"a\x" AND "b"'):
        with pytest.raises(QueryParseError):
            parse(query)
        assert not gbnf(query)


def test_a_query_nested_past_pythons_stack_is_a_parse_error():
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default, whatever the test runner set: the queries below nest past it
    try:
        assert parse("(" * 3000 + '"a"' + ")" * 3000) == Term("a")  # bare parentheses are no nesting
        for query in ('"b" AND (' * 1500 + '"a"' + ")" * 1500, "NOT (" * 1500 + '"a"' + ")" * 1500):
            with pytest.raises(QueryParseError, match="nests groups too deeply"):
                parse(query)
    finally:
        sys.setrecursionlimit(limit)


def test_an_operator_named_twice_is_refused():
    with pytest.raises(OperatorError, match="names and twice"):
        Operators.parse("and=min,or=max,and=product")
