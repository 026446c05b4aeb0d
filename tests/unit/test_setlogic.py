"""Set-logic queries over LIMIT: parsing the like-lists, the templates, exact gold, determinism."""

import gzip
import json

import pandas as pd
import pytest

from logicrank.pipelines.evaluation.experiment import grouped
from logicrank.pipelines.generate import setlogic
from logicrank.pipelines.generate.setlogic import TEMPLATES, SetLogicError, generate, load_limit, parse_likes
from logicrank.pipelines.retrieval.logic.query import parse


def test_like_lists_parse_with_items_holding_and():
    assert parse_likes("Ann Lee", "Ann Lee likes Tea, Fish and Chips, Cats and Dogs.") == ["Tea", "Fish and Chips", "Cats", "Dogs"]
    assert parse_likes("Ann Lee", "Ann Lee likes Tea and Cats.") == ["Tea", "Cats"]
    with pytest.raises(SetLogicError, match="is not 'Bo likes"):
        parse_likes("Bo", "Ann Lee likes Tea and Cats.")


def test_an_item_holding_and_among_the_last_two_is_split_by_the_items_read_elsewhere(tmp_path):
    """LIMIT's items include "Macaroni and Cheese" and "Fish and Chips": "..., Boots and Macaroni
    and Cheese." was read as "Boots and Macaroni" and "Cheese", and the qrels check (only items
    with a query) let it through: Cy missing from two gold sets, an item invented. The split is
    the one into items read where nothing is ambiguous; a list no such item settles is refused."""
    docs = {"Ann Lee": "Macaroni and Cheese, Kites and Boots", "Cy Dunn": "Kites, Boots and Macaroni and Cheese", "Di Eno": "Boots and Kites"}
    items = {"q1": ("Macaroni and Cheese", ["Ann Lee", "Cy Dunn"]), "q2": ("Boots", ["Ann Lee", "Cy Dunn", "Di Eno"]),
             "q3": ("Kites", ["Ann Lee", "Cy Dunn", "Di Eno"])}
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"_id": n, "title": "", "text": f"{n} likes {t}."}) + "\n" for n, t in docs.items()))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"Who likes {i}?"}) + "\n" for q, (i, _) in items.items()))
    (tmp_path / "qrels.jsonl").write_text("".join(json.dumps({"query-id": q, "corpus-id": n, "score": 1}) + "\n"
                                                  for q, (_, names) in items.items() for n in names))
    likes = load_limit(tmp_path)
    assert likes["Cy Dunn"] == ["Kites", "Boots", "Macaroni and Cheese"] and likes["Ann Lee"] == ["Macaroni and Cheese", "Kites", "Boots"]
    with pytest.raises(SetLogicError, match="the like-list is ambiguous"):
        parse_likes("Cy Dunn", "Cy Dunn likes Kites, Boots and Macaroni and Cheese.")  # nothing read elsewhere settles it


def test_two_people_whose_names_make_one_document_id_are_refused(tmp_path):
    """A document id is the name with spaces as '_': "Ann Lee" and "Ann_Lee" were one id, two
    people merged in the corpus and the qrels (the one who likes Limes relevant to "not Limes")."""
    docs = {"Ann Lee": "Tapirs and Quokkas", "Ann_Lee": "Tapirs and Limes", "Bob Roy": "Limes and Quokkas"}
    items = {"q1": ("Tapirs", ["Ann Lee", "Ann_Lee"]), "q2": ("Quokkas", ["Ann Lee", "Bob Roy"]), "q3": ("Limes", ["Ann_Lee", "Bob Roy"])}
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"_id": n, "title": "", "text": f"{n} likes {t}."}) + "\n" for n, t in docs.items()))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"Who likes {i}?"}) + "\n" for q, (i, _) in items.items()))
    (tmp_path / "qrels.jsonl").write_text("".join(json.dumps({"query-id": q, "corpus-id": n, "score": 1}) + "\n"
                                                  for q, (_, names) in items.items() for n in names))
    with pytest.raises(SetLogicError, match="'Ann Lee' and 'Ann_Lee' make one document id 'Ann_Lee'"):
        generate(tmp_path / "out", 2, 0, root=tmp_path)


def test_the_bundled_lists_reproduce_limits_own_qrels():
    likes = load_limit()  # raises when any of the 1,000 queries' holders differ from its qrels
    assert len(likes) == 46 and all(len(items) == 45 for items in likes.values())


def test_a_corpus_whose_lists_disagree_with_its_qrels_is_refused(tmp_path):
    src = setlogic.LIMIT_DIR
    for stem in ("corpus", "queries", "qrels"):
        with gzip.open(src / f"{stem}.jsonl.gz", "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        if stem == "qrels":
            first = json.loads(lines[0])
            lines[0] = json.dumps({**first, "corpus-id": "Somebody Else"})
        (tmp_path / f"{stem}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SetLogicError, match="the corpus is not LIMIT-shaped"):
        load_limit(tmp_path)


def test_templates_print_questions_logical_queries_and_forms():
    by = {t.name: t for t in TEMPLATES}
    assert [t.name for t in TEMPLATES] == ["A", "A and B", "A or B", "A or B or C", "A and B and C", "A but not B", "A and B but not C"]
    t = by["A and B but not C"]
    assert t.question(("Tea", "Cats", "Dogs")) == "Who likes Tea and Cats but not Dogs?"
    assert t.logical(("Tea", "Cats", "Dogs")) == '"Tea" AND "Cats" AND NOT "Dogs"'
    assert t.form() == '"a1" AND "a2" AND NOT "a3"'
    assert by["A or B or C"].question(("x", "y", "z")) == "Who likes x, y or z?"
    assert by["A or B or C"].logical(("x", "y", "z")) == '"x" OR "y" OR "z"'
    for t in TEMPLATES:  # every printed form parses
        parse(t.form())


def _sets(likes):
    holders = {}
    for p, items in likes.items():
        for i in items:
            holders.setdefault(i, set()).add(p)
    return holders


def test_gold_sets_equal_plain_set_algebra_and_are_neither_empty_nor_everyone(tmp_path):
    counts = generate(tmp_path, per_template=15, seed=4)
    likes = load_limit()
    h = _sets(likes)
    everyone = set(likes)
    algebra = {
        "A": lambda a: h[a[0]],
        "A and B": lambda a: h[a[0]] & h[a[1]],
        "A or B": lambda a: h[a[0]] | h[a[1]],
        "A or B or C": lambda a: h[a[0]] | h[a[1]] | h[a[2]],
        "A and B and C": lambda a: h[a[0]] & h[a[1]] & h[a[2]],
        "A but not B": lambda a: h[a[0]] - h[a[1]],
        "A and B but not C": lambda a: (h[a[0]] & h[a[1]]) - h[a[2]],
    }
    queries = [json.loads(line) for line in (tmp_path / "queries.jsonl").read_text().splitlines()]
    assert len(queries) == counts["queries"] == 7 * 15
    keys = set()
    for q in queries:
        expected = algebra[q["template"]](q["items"])
        assert {setlogic.doc_id(p) for p in expected} == set(q["gold"]), q
        assert 0 < len(expected) < len(everyone)
        assert len(q["atoms"]) == len(q["items"]) and q["atoms"][0]["text"] == f"{{x}} likes {q['items'][0]}"
        keys.add((q["template"], tuple(q["items"])))
    assert len(keys) == len(queries)  # no repeats
    qrels = (tmp_path / "qrels" / "test.tsv").read_text().splitlines()[1:]
    assert len(qrels) == counts["qrels"] == sum(len(q["gold"]) for q in queries)
    for q in queries:  # whom the NOT takes out of the positive part's answers
        if q["template"] == "A but not B":
            assert set(q["negated_out"]) == {setlogic.doc_id(p) for p in h[q["items"][0]] & h[q["items"][1]]}
        elif q["template"] == "A and B but not C":
            assert set(q["negated_out"]) == {setlogic.doc_id(p) for p in h[q["items"][0]] & h[q["items"][1]] & h[q["items"][2]]}
        else:
            assert q["negated_out"] == []
    bites = counts["negation_bites"]
    assert bites["A but not B"] == 15  # hard negatives: every NOT item is liked by the other holder of A
    assert bites["A and B but not C"] == 0  # LIMIT-small: no two people share two items, so nothing is left to take out


def test_same_seed_same_bytes_other_seed_other_queries(tmp_path):
    generate(tmp_path / "a", per_template=5, seed=1)
    generate(tmp_path / "b", per_template=5, seed=1)
    generate(tmp_path / "c", per_template=5, seed=2)
    for f in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "decompositions.parquet", "generation.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "queries.jsonl").read_bytes() != (tmp_path / "c" / "queries.jsonl").read_bytes()
    # a template's draws do not depend on the other templates
    generate(tmp_path / "d", per_template=5, seed=1, templates=("A but not B",))
    qa = [q for q in map(json.loads, (tmp_path / "a" / "queries.jsonl").read_text().splitlines()) if q["template"] == "A but not B"]
    qd = list(map(json.loads, (tmp_path / "d" / "queries.jsonl").read_text().splitlines()))
    assert qa == qd


def test_the_gold_decompositions_table_feeds_a_decomposition_stage(tmp_path):
    import pyarrow as pa

    from logicrank.pipelines.llm.decompose import apply_to_queries

    generate(tmp_path, per_template=2, seed=0)
    queries = [json.loads(line) for line in (tmp_path / "queries.jsonl").read_text().splitlines()]
    table = pa.table({"query_id": [q["_id"] for q in queries], "text": [q["text"] for q in queries]})
    out = apply_to_queries(table, pa.parquet.read_table(tmp_path / "decompositions.parquet"), "orlog")
    assert out.column("logical_query").to_pylist() == [q["form"] for q in queries]
    assert out.column("atoms").to_pylist()[-1] == queries[-1]["atoms"]


def test_unknown_templates_are_refused(tmp_path):
    with pytest.raises(SetLogicError, match="unknown template"):
        generate(tmp_path, templates=("A xor B",))


def test_measures_are_averaged_per_template(tmp_path):
    """An experiment's group_by (pipelines/evaluation/experiment/report.py): each run's measures over the queries of
    each group of a field of the queries file (P@1: their mean), the aggregate row left out, with the number of queries."""
    import pyarrow as pa

    m = pa.Table.from_pandas(pd.DataFrame({"run_id": ["r"] * 5, "query_id": ["1", "2", "3", "9", "all"], "measure": ["P@1"] * 5,
                                           "value": [1.0, 0.0, 1.0, 1.0, 0.75]}))  # 9: a qrels query the queries file lacks
    # each query known by its id as the run reads it (read_queries: query_id before _id; qid, id): not one group "None"
    for key in ("_id", "qid", "id", "query_id"):
        rows = [{key: q, "text": f"question {q}", "template": t} for q, t in [("1", "A"), ("2", "A"), ("3", "A or B")]]
        if key == "query_id":
            rows = [{**r, "_id": f"beir-{r['query_id']}"} for r in rows]
        (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        t = grouped(m, tmp_path / "q.jsonl", "template")
        assert t.loc[("r", "A"), "P@1"] == 0.5 and t.loc[("r", "A or B"), "P@1"] == 1.0, key
        assert t["queries"].to_dict() == {("r", "A"): 2, ("r", "A or B"): 1}, key  # 9 in no group, no row of its own
