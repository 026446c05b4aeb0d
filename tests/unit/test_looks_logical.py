"""A notebook's one query string (``table.search``): one that parses is a logical query; one
that looks like a logical query and does not parse is refused in the one line the retrieve job
refuses such a queries file with; plain words stay plain words."""

from __future__ import annotations

import pytest

import logicrank as lr
from logicrank.pipelines.retrieval.logic.query import UnparsedQueryError, looks_logical
from tests.unit.test_notebook_api import table_db  # noqa: F401 (the fixture)

MEANT = {  # near-miss logical queries: each refused
    "one quote missing": '"vitamin D" AND NOT "bone',
    "no quotes": "vitamin D AND NOT bone",
    "a minus for NOT": '"vitamin D" -"bone"',
    "typographic quotes": "“vitamin D” AND NOT “bone”",
    "single quotes": "'vitamin D' AND NOT 'bone'",
    "NOT before a word": "vitamin D (NOT bone)",
    "an unterminated typographic quote": "“vitamin D AND bone",
    "lower case, one quote missing": '"vitamin D" and not "bone',
    "lower-case keywords between quoted terms": '"vitamin D" and not "bone" health',
    "lower-case keywords between a quoted term and a group": '"vitamin D" and ("bone" or calcium)',
    "only keywords outside the quotes": 'and not "bone"',
    "upper-case keywords beside quotes": '"vitamin D" AND NOT bone',
    "an inch mark, then a quote missing": 'a 15" screen AND NOT "glare',
    # old code: plain words, and BM25 dropped "but" and "not" as stop words, so "bone" was raised
    "but not between quoted terms": '"vitamin D" but not "bone"',
    "except between quoted terms": '"museums in Paris" except not "art"',
}
PLAIN = {  # text
    "lower-case and": "vitamin D and bone health",
    "a quoted phrase": '"vitamin D" deficiency',
    "typographic quotes around a phrase": "the “hygiene hypothesis” of allergy",
    "a keyword inside quotes": '"not now" deficiency',
    "all upper case": "VITAMIN D AND BONE HEALTH",
    "a leading acronym": "OR nurses burnout",
    "a word starting with NOT": "NOTCH signaling in bone",
    "a hyphen": "vitamin-D deficiency",
    "lower-case and after a quoted phrase": 'effects of "intermittent fasting" and weight loss',
    "lower-case not after a quoted phrase": 'is "long covid" not real',
    "lower-case keywords beside one quoted term": '"vitamin D" and not bone',
    "an inch mark": 'laptops with a 15" screen',
    "a double prime for inches": "a 15″ laptop",
    "an inch mark and a quoted phrase": 'a 15" screen and "retina" display',
    "a quoted phrase ending in a digit": '"vitamin D3" and bone health',
    "two quoted phrases": '"vitamin D" "bone health" trials',
    "but between quoted phrases, no keyword": '"cheap" but "good" hotels',
}


@pytest.mark.parametrize("name", sorted(MEANT))
def test_a_near_miss_looks_logical(name):
    assert looks_logical(MEANT[name])


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_words_do_not(name):
    assert not looks_logical(PLAIN[name])


@pytest.mark.parametrize("name", sorted(MEANT))
def test_search_refuses_a_near_miss_in_the_retrieve_jobs_line(table_db, name):  # noqa: F811
    query = MEANT[name]
    with pytest.raises(UnparsedQueryError) as exc:
        lr.open_table(table_db).search(query, lr.itlr(scorer="bm25"))
    message = str(exc.value)
    assert isinstance(exc.value, lr.UserError) and "\n" not in message
    assert message.startswith(f"table.search: query 1's logical query {query!r} does not parse at position ")
    assert message.endswith('Quote each term with straight double quotes ("vitamin D" AND NOT "bone"); plain words without quotes '
                            "or upper-case AND, OR, NOT are searched as text.")


def test_the_hint_names_typographic_quotes(table_db):  # noqa: F811
    with pytest.raises(UnparsedQueryError, match=r"position 0: unexpected character '“' \(terms take straight double quotes"):
        lr.open_table(table_db).search("“malaria” AND NOT “children”", "bm25")


def test_plain_words_and_logical_queries_still_search(table_db):  # noqa: F811
    table = lr.open_table(table_db)
    text = table.search("malaria and children", "bm25")  # the words, searched as text (bm25 drops 'and')
    assert text["doc_id"].tolist() == table.search("malaria children", "bm25")["doc_id"].tolist()
    assert set(text["doc_id"]) == {"d0", "d1", "d2", "d4"}
    logical = table.search('"malaria" AND NOT "children"', lr.itlr(scorer="bm25"))
    assert logical["doc_id"].tolist()[:2] in (["d1", "d2"], ["d2", "d1"]) and "d4" not in set(logical["doc_id"])


@pytest.mark.parametrize("query", ['"malaria" and children', 'is "malaria" not in children', 'malaria in 15" children'])
def test_plain_words_with_quotes_are_searched_as_text(table_db, query):  # noqa: F811
    """A quoted phrase or an inch mark among plain words (where the words outside the quotes are
    not only keywords between quoted terms) is text: the same documents as the words alone."""
    table = lr.open_table(table_db)
    words = table.search(query.replace('"', " "), "bm25")
    assert table.search(query, "bm25")["doc_id"].tolist() == words["doc_id"].tolist()
    assert set(words["doc_id"]) == {"d0", "d1", "d2", "d4"}


def test_a_blank_logical_query_is_refused(table_db):  # noqa: F811
    with pytest.raises(lr.UserError, match="table.search: logical_query is blank") as exc:
        lr.open_table(table_db).search("malaria", "bm25", logical_query="  ")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("query", ['"vitamin D” AND NOT “bone"', '"a" AND "b” OR “c"', '"vitamin D″ AND NOT ″bone"', '"a” AND (“b"',
                                   # keywords read in any case: a lower-case NOT was lost in one term (old code), so was one
                                   # between curly single quotes
                                   '"vitamin D” and not “bone"', '"vitamin D” And Not “bone"', '"a” not “b"', '"vitamin D’ AND NOT ‘bone"',
                                   '"vitamin D’ AND ‘bone"', '"vitamin D’ OR ‘bone"'])
def test_curly_quotes_inside_straight_ones_around_an_operator_are_refused(query):
    """Fixing a fully curly query's first and last quotes leaves curly ones inside: the whole
    formula parsed as one term, and a NOT was searched as the word "not". Refused, at the
    curly quote; a term that only holds curly quotes (a title, "or"/"and" between them in
    lower case) still parses."""
    from logicrank.pipelines.retrieval.logic.query import QueryParseError, Term, parse

    with pytest.raises(QueryParseError, match="typographic quotes delimit no term"):
        parse(query)
    assert parse('"the “Godfather” and “Scarface” films"') == Term("the “Godfather” and “Scarface” films")
    assert parse('"the “yes” or “no” question"') == Term("the “yes” or “no” question")
    assert list(parse('"children’s books" AND NOT "bone"').terms()) == ["children’s books", "bone"]  # (an apostrophe: no quote)
