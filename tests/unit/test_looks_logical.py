"""A notebook's one query string (``table.search``): one that parses is a logical query; one
that looks like a logical query and does not parse is refused in the one line the retrieve job
refuses such a queries file with; plain words stay plain words."""

from __future__ import annotations

import pytest

import logicrank as lr
from logicrank.pipelines.logic.query import UnparsedQueryError, looks_logical
from tests.unit.test_notebook_api import table_db  # noqa: F401 (the fixture)

MEANT = {  # near-miss logical queries: each refused
    "one quote missing": '"vitamin D" AND NOT "bone',
    "no quotes": "vitamin D AND NOT bone",
    "a minus for NOT": '"vitamin D" -"bone"',
    "typographic quotes": "“vitamin D” AND NOT “bone”",
    "single quotes": "'vitamin D' AND NOT 'bone'",
    "lower-case keywords beside quotes": '"vitamin D" and not bone',
    "NOT before a word": "vitamin D (NOT bone)",
    "an unterminated typographic quote": "“vitamin D AND bone",
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


def test_a_blank_logical_query_is_refused(table_db):  # noqa: F811
    with pytest.raises(lr.UserError, match="table.search: logical_query is blank") as exc:
        lr.open_table(table_db).search("malaria", "bm25", logical_query="  ")
    assert "\n" not in str(exc.value)
