"""Retrieval measures, named by strings parsed once (``nDCG@10``, ``P@1``, ``MRR``, ``Bpref``,
``ndcg_cut_10``...), computed by ir_measures (its pytrec_eval provider: trec_eval's own C code).

A :class:`Measure` is a small hashable value whose ``str`` is canonical and parses back to
itself. Three spellings name the same measure:

- the project's: ``nDCG[@k]``, ``P@k``, ``R@k``, ``F1@k``, ``MRR[@k]``, ``MAP[@k]``
  (case-insensitive; ``MRR`` is ir_measures' ``RR``, ``MAP`` its ``AP``);
- any ir_measures name a provider here computes, with its parameters: ``AP@100``, ``RR@10``,
  ``Bpref``, ``infAP``, ``Rprec``, ``Judged@10``, ``Success@10``, ``IPrec@0.5``, ``NumQ``,
  ``NumRet``, ``NumRel``, ``NumRelRet``, ``SetP``, ``SetR``, ``SetF``, ``SetAP``, ``SetRelP``,
  ``Compat``, ``P(rel=2)@10``...;
- trec_eval's, as it prints them: ``ndcg_cut_10``, ``map``, ``map_cut_100``, ``recip_rank``,
  ``P_5``, ``recall_100``, ``success_10``, ``iprec_at_recall_0.50``, ``bpref``, ``num_rel``...

The canonical spelling is the project's for its six families (``RR@10`` prints ``MRR@10``,
``map_cut_100`` prints ``MAP@100``) and ir_measures' otherwise. F1@k is not an ir_measures
measure: it is the harmonic mean of P@k and R@k, which ir_measures computes. trec_eval's
measures that ir_measures does not name (``gm_map``, ``gm_bpref``, ``Rprec_mult_0.20``,
``relative_P_5``, ``utility``, ``binG``, ``G``, ``ndcg_rel``, ``Rndcg``,
``num_nonrel_judged_ret``) keep trec_eval's spelling, a parameter as trec_eval prints it
(``Rprec_mult_0.2`` is ``Rprec_mult_0.20``, ``relative_P_05`` ``relative_P_5``: pytrec_eval
keys its result so), and are computed by trec_eval's code (pytrec_eval) directly,
aggregated over queries as trec_eval does (a geometric mean for ``gm_*``, whose per-query
values are trec_eval's logs; a sum for counts). trec_eval 10's
``rbp``, ``rbp_resid`` and ``unj_k``, which pytrec_eval's trec_eval lacks, and its
``iprec_at_recall_r`` and ``11pt_avg``, which it rounds otherwise, are computed by
:mod:`logicrank.pipelines.evaluation.trec10`.

Conventions follow trec_eval (the reference the tests compare with):

- a document is relevant when its relevance >= 1 (``rel=`` changes it); unjudged documents count as 0;
- nDCG uses the graded relevance as gain and log2(rank + 1) as discount;
- a qrels query with no row in the run scores 0 on every measure (trec_eval ``-c``), except the
  counts trec_eval -c still gives such a query: NumQ 1 and NumRel its relevant documents;
  queries in the run but not in the qrels are not evaluated;
- the mean over queries (query ``all``) is a sum for the counts (NumQ, NumRet, NumRel,
  NumRelRet), as trec_eval prints them;
- the ranking is the run's ``rank`` column, never trec_eval's score order: a TREC run file is
  ranked by score descending (the score in 32 bits, as trec_eval stores it), equal scores by
  docno descending, by ``read_run``, whatever its rank column says; a Parquet run keeps its
  ``rank``, which must agree with its scores (a better rank never has a lower score in 32
  bits; ties in any order). The provider is given the score ``-rank`` so that it follows
  those ranks;
- a run or qrels that repeats a (query, doc) pair, a run with a non-finite score, and an
  empty run file or qrels are refused, never scored (``logicrank.pipelines.io.check_run`` and ``check_qrels`` check the rules).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from logicrank.pipelines.evaluation import trec10
from logicrank.schemas.errors import UserError

# The project's families: its spelling -> ir_measures' name (F1: computed here from P and R).
PROJECT = {"nDCG": "nDCG", "P": "P", "R": "R", "F1": None, "MRR": "RR", "MAP": "AP"}
# ir_measures' names accepted besides its measures' own NAMEs (its other aliases, e.g.
# Recall, Precision, NDCG, are not: one spelling per measure).
IR_ALIASES = {"NumRelRet": "NumRet(rel=1)", "SetRelP": "SetP(relative=True)"}
# Families whose "@" is not an integer rank cutoff but a level in [0, 1].
LEVEL_AT = {"IPrec"}
# The largest rank cutoff: trec_eval reads one into a C long (a larger one saturates, keyed otherwise).
MAX_CUTOFF = 2**63 - 1
# The valid spellings, briefly, for the one-line error.
SYNTAX = ("nDCG[@k]", "P@k", "R@k", "F1@k", "MRR[@k]/RR[@k]", "MAP[@k]/AP[@k]", "Bpref", "infAP", "Rprec", "Judged[@k]",
          "Success@k", "IPrec@r", "NumQ", "NumRet", "NumRel", "NumRelRet", "SetP", "SetR", "SetF", "SetAP", "SetRelP", "Compat")
_SYNTAX = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)\s*(\([^()]*\))?\s*(?:@\s*([0-9]+(?:\.[0-9]+)?))?\s*$")
_TREC = re.compile(r"^\s*([A-Za-z0-9]+(?:_[A-Za-z]+)*)(?:[_.]([0-9]+(?:\.[0-9]+)?))?\s*$")
_DISPLAY = {v: k for k, v in IR_ALIASES.items()}
# trec_eval's measures ir_measures does not name, computed by pytrec_eval directly (trec10's by
# trec10.py): family -> whether it takes a parameter after "_" (Rprec_mult_0.20, relative_P_5, unj_10)
TREC_ONLY = {"gm_map": False, "gm_bpref": False, "utility": False, "binG": False, "G": False,
             "ndcg_rel": False, "Rndcg": False, "num_nonrel_judged_ret": False, "Rprec_mult": True, "relative_P": True,
             **trec10.FAMILIES}
_TREC_ONLY = re.compile(r"^(" + "|".join(sorted(map(re.escape, TREC_ONLY), key=len, reverse=True)) + r")(?:[_.]([0-9]+(?:\.[0-9]+)?))?$")
# rbp's persistence, as trec_eval prints it (rbp_p=0.95, rbp_resid_p=0.5) or takes it (rbp.p=0.95)
_PERSISTENCE = re.compile(r"^(rbp|rbp_resid)[_.]p=([0-9]*\.?[0-9]+)$")


# the families a run improves by lowering (Measure.lower_is_better)
LOWER_IS_BETTER = frozenset({"unj", "rbp_resid", "num_nonrel_judged_ret"})


class MeasureError(UserError, ValueError):
    """A measure name that does not parse; the message lists the valid ones."""


@cache
def provider():
    """The ir_measures providers that compute measures here, first match wins: pytrec_eval
    (trec_eval's code), then the pure-Python judged (Judged@k), msmarco (RR@k) and compat."""
    import ir_measures

    return ir_measures.providers.FallbackProvider([ir_measures.pytrec_eval, ir_measures.judged, ir_measures.msmarco, ir_measures.compat])


@cache
def _families() -> dict[str, str]:
    """Lower-case name -> canonical family spelling: the project's, then ir_measures'."""
    import ir_measures

    out = {k.lower(): k for k in PROJECT}
    for key, cls in ir_measures.measures.registry.items():
        if key == cls.NAME or key in IR_ALIASES:
            out.setdefault(key.lower(), {"AP": "MAP", "RR": "MRR"}.get(key, key))
    return out


@dataclass(frozen=True, order=True)
class Measure:
    """``name``: the family's canonical spelling; ``cutoff``: the value after ``@`` (a rank
    cutoff, IPrec's recall level); ``params``: ir_measures' other parameters, ``"(rel=2)"``."""

    name: str
    cutoff: int | float | None = None
    params: str = ""  # trec_eval-only measures: the parameter as trec_eval prints it (``"0.20"`` of Rprec_mult_0.2), its result's key
    trec: bool = False  # computed by pytrec_eval (or trec10) directly, under trec_eval's name (TREC_ONLY)

    def __str__(self) -> str:
        if self.trec:
            return self.name + (f"_{self.params}" if self.params else "")
        return f"{self.name}{self.params}" + ("" if self.cutoff is None else f"@{self.cutoff}")

    @property
    def trec_request(self) -> str:
        """What pytrec_eval is asked for (``relative_P.5``; its result is keyed ``relative_P_5``)."""
        return self.name + (f".{self.params}" if self.params else "")

    def __repr__(self) -> str:
        return f"Measure({str(self)!r})"

    def ir_measures(self) -> list:
        """The ir_measures measures this one is computed from (F1@k: P@k and R@k)."""
        import ir_measures

        if self.name == "F1":
            return [ir_measures.P @ self.cutoff, ir_measures.R @ self.cutoff]
        at = "" if self.cutoff is None else f"@{self.cutoff}"
        return [ir_measures.parse_measure(f"{PROJECT.get(self.name) or self.name}{self.params}{at}")]

    def combine(self, values: list[float]) -> float:
        """This measure's value for one query from those of :meth:`ir_measures` (F1: of P and R)."""
        if self.name != "F1":
            return values[0]
        p, r = values
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def lower_is_better(self) -> bool:
        """Whether a fall of this measure is an improvement: ``unj_k`` (unjudged documents in
        the top k), ``rbp_resid`` (what unjudged documents could add) and
        ``num_nonrel_judged_ret`` (judged non-relevant documents retrieved). Every other
        measure is better higher; NumQ, NumRet and NumRel count what was asked and returned,
        and are read as the others."""
        return self.name in LOWER_IS_BETTER

    @property
    def is_count(self) -> bool:
        """NumQ, NumRet, NumRel, NumRelRet (and trec_eval's num_nonrel_judged_ret): summed over
        queries (query ``all``), as trec_eval does."""
        from ir_measures.measures.base import SumAgg

        if self.trec:
            return self.name.startswith("num_")
        return self.name != "F1" and isinstance(self.ir_measures()[0].aggregator(), SumAgg)

    def aggregate(self, values) -> float:
        """The value over queries (query ``all``): trec_eval's aggregation (a sum for counts, a
        geometric mean of the logs for ``gm_*``, else the mean)."""
        import numpy as np

        if len(values) == 0:
            return 0.0
        if self.trec:
            import pytrec_eval

            return float(pytrec_eval.compute_aggregated_measure(self.name, list(map(float, values))))
        return float(np.sum(values)) if self.is_count else float(np.mean(values))


def valid_names() -> list[str]:
    return [*SYNTAX, "any ir_measures name with its parameters (e.g. P(rel=2)@10)",
            "any trec_eval name (ndcg_cut_10, map, recip_rank, P_5, recall_100, bpref, iprec_at_recall_0.50, num_rel, gm_map, "
            "Rprec_mult_0.20, relative_P_5, utility, 11pt_avg, rbp, rbp_p=0.95, rbp_resid, unj_10...)"]


def _unknown(text: object) -> MeasureError:
    return MeasureError(f"unknown measure {text!r}; valid: {', '.join(valid_names())} (k a positive integer, r a recall level in [0, 1]).")


def parse_measure(text: str) -> Measure:
    """``"ndcg@10"``, ``"nDCG@10"``, ``"ndcg_cut_10"`` -> ``Measure('nDCG@10')``; the
    project's and ir_measures' names are case-insensitive, trec_eval's as it prints them."""
    if not isinstance(text, str):
        raise _unknown(text)
    if _TREC_ONLY.match(text.strip()) or _PERSISTENCE.match(text.strip()):  # trec_eval's rbp, not ir_measures' RBP
        return _parse_trec(text)
    m = _SYNTAX.match(text)
    family = _families().get(m.group(1).lower()) if m else None
    if family is None:
        return _parse_trec(text)
    params, at = m.group(2) or "", m.group(3)
    if family not in LEVEL_AT and at is not None and not at.isdigit():
        raise MeasureError(f"measure {text!r}: the cutoff must be a positive integer.")
    cutoff = (float(at) if family in LEVEL_AT else int(at)) if at is not None else None
    if family not in LEVEL_AT and cutoff is not None and cutoff < 1:
        raise MeasureError(f"measure {text!r}: the cutoff must be >= 1.")
    if family not in LEVEL_AT and cutoff is not None and cutoff > MAX_CUTOFF:
        raise MeasureError(f"measure {text!r}: the cutoff must be at most {MAX_CUTOFF} (trec_eval's C long).")
    if family in LEVEL_AT and cutoff is not None and not 0 <= cutoff <= 1:
        raise MeasureError(f"measure {text!r}: the recall level must be in [0, 1].")
    if family == "F1":
        if params:
            raise MeasureError(f"measure {text!r}: F1@k takes no parameters.")
        if cutoff is None:
            raise MeasureError(f"measure {text!r} needs a cutoff, e.g. F1@10.")
        return Measure("F1", cutoff)
    return _checked(text, family, params, cutoff)


def _checked(text: str, family: str, params: str, cutoff: int | float | None) -> Measure:
    """The measure ir_measures parses from these parts, in canonical spelling, if a provider here computes it."""
    import ir_measures

    at = "" if cutoff is None else f"@{cutoff}"
    spelled = f"{PROJECT.get(family) or family}{params}{at}"
    try:
        ir = ir_measures.parse_measure(spelled)
        ir.validate_params()
    except (AssertionError, ValueError, TypeError, NameError, SyntaxError) as exc:
        if cutoff is None and "cutoff" in str(exc):
            raise MeasureError(f"measure {text!r} needs a cutoff, e.g. {family}@10.") from None
        if cutoff is None and "recall" in str(exc):
            raise MeasureError(f"measure {text!r} needs a recall level, e.g. {family}@0.5.") from None
        raise MeasureError(f"measure {text!r}: {str(exc) or type(exc).__name__}; valid: {', '.join(valid_names())}.") from None
    if not provider().supports(ir):
        raise MeasureError(f"measure {text!r} ({ir}): no ir_measures provider installed here computes it; valid: {', '.join(SYNTAX)}.")
    return _canonical(ir)


def _canonical(ir) -> Measure:
    """The Measure of an ir_measures measure, in the project's spelling."""
    text = str(ir)
    head = re.match(r"^([^(@]*(?:\([^()]*\))?)(?:@(.+))?$", text)
    body, at = head.group(1), head.group(2)
    body = _DISPLAY.get(body, body)
    name = re.match(r"^[A-Za-z0-9]+", body).group(0)
    name = {"AP": "MAP", "RR": "MRR"}.get(name, name)
    params = body[len(re.match(r"^[A-Za-z0-9]+", body).group(0)):]
    cutoff = None if at is None else (int(at) if at.isdigit() else float(at))
    return Measure(name, cutoff, params)


def _parse_trec(text: str) -> Measure:
    """A trec_eval name (``ndcg_cut_10``, ``P_5``, ``iprec_at_recall_0.50``), through ir_measures' mapping."""
    import ir_measures
    import pytrec_eval

    name = text.strip()
    rbp = _PERSISTENCE.match(name)
    if rbp:
        if not 0 < float(rbp.group(2)) < 1:
            raise MeasureError(f"measure {text!r}: the persistence p must be in (0, 1), e.g. {rbp.group(1)}_p=0.95.")
        p = float(rbp.group(2))
        return Measure(rbp.group(1), None, "" if p == trec10.DEFAULT_P else f"p={p!r}", trec=True)
    only = _TREC_ONLY.match(name)
    if only and only.group(1) == "unj" and only.group(2) is not None:
        if not (only.group(2).isdigit() and int(only.group(2)) >= 1):
            raise MeasureError(f"measure {text!r}: unj's cutoff must be a positive integer, e.g. unj_10.")
        return Measure("unj", None, str(int(only.group(2))), trec=True)
    if only and only.group(1) == "relative_P" and only.group(2) is not None:  # trec_eval's key: the integer (relative_P_05 -> _5)
        if not (only.group(2).isdigit() and 1 <= int(only.group(2)) <= MAX_CUTOFF):
            raise MeasureError(f"measure {text!r}: relative_P's cutoff must be a positive integer (at most {MAX_CUTOFF}), e.g. relative_P_10.")
        return Measure("relative_P", None, str(int(only.group(2))), trec=True)
    if only and only.group(1) == "Rprec_mult" and only.group(2) is not None:  # trec_eval's key: 2 decimals (_0.2 -> _0.20)
        mult = float(only.group(2))
        if float(f"{mult:.2f}") != mult:  # trec_eval would compute at 0.125 but name it Rprec_mult_0.12
            raise MeasureError(f"measure {text!r}: trec_eval names Rprec_mult's multiplier to 2 decimals; give one with at most 2, "
                               "e.g. Rprec_mult_0.20.")
        if mult >= 100000:  # trec_eval's name keeps 8 characters of it: Rprec_mult_100000.0
            raise MeasureError(f"measure {text!r}: Rprec_mult's multiplier must be below 100000 (trec_eval's name cuts a longer one).")
        return Measure("Rprec_mult", None, f"{mult:.2f}", trec=True)
    if only and only.group(1) == "iprec_at_recall" and only.group(2) is not None:
        level = float(only.group(2))
        if not 0 <= level <= 1:
            raise MeasureError(f"measure {text!r}: the recall level must be in [0, 1], e.g. iprec_at_recall_0.50.")
        return Measure("iprec_at_recall", None, f"{level:.2f}" if float(f"{level:.2f}") == level else repr(level), trec=True)
    if only and TREC_ONLY[only.group(1)] == (only.group(2) is not None):
        return Measure(only.group(1), None, only.group(2) or "", trec=True)
    if only:
        example = {"Rprec_mult": "Rprec_mult_0.20", "unj": "unj_10", "iprec_at_recall": "iprec_at_recall_0.50"}.get(only.group(1), f"{only.group(1)}_10")
        raise MeasureError(f"measure {text!r}: trec_eval's {only.group(1)} " + (
            f"takes a parameter, e.g. {example}" if TREC_ONLY[only.group(1)] else
            "takes no parameter" + (f" but its persistence, e.g. {only.group(1)}_p=0.95" if only.group(1) in ("rbp", "rbp_resid") else "")) + ".")
    if not _TREC.match(name) or name in pytrec_eval.supported_nicknames:
        raise _unknown(text)
    try:
        found = ir_measures.parse_trec_measure(name)
    except (ValueError, KeyError, TypeError):
        raise _unknown(text) from None
    if len(found) != 1:  # "recall" alone: trec_eval's list of cutoffs
        raise _unknown(text)
    if not provider().supports(found[0]):
        raise MeasureError(f"measure {text!r} ({found[0]}): no ir_measures provider installed here computes it.")
    measure = _canonical(found[0])
    if measure.name not in LEVEL_AT and measure.cutoff is not None and measure.cutoff < 1:  # ndcg_cut_0 aborts pytrec_eval
        raise MeasureError(f"measure {text!r}: the cutoff must be >= 1.")
    if measure.name not in LEVEL_AT and measure.cutoff is not None and measure.cutoff > MAX_CUTOFF:
        raise MeasureError(f"measure {text!r}: the cutoff must be at most {MAX_CUTOFF} (trec_eval's C long).")
    return measure


def over_queries(name: str, values) -> float:
    """The value over queries of the measure a METRICS table names ``name``, from its per-query
    values (a group's, a run's): the measure's own aggregation (:meth:`Measure.aggregate`: a sum
    for counts, the geometric mean for ``gm_*``, whose per-query values are logs; else the
    mean); the mean for a name no retrieval measure has (an answers measure)."""
    import numpy as np

    try:
        measure = parse_measure(name)
    except MeasureError:
        return float(np.mean(values)) if len(values) else 0.0
    return measure.aggregate(values)


def lower_is_better(name: str) -> bool:
    """Whether a fall of the measure a metrics table names ``name`` is an improvement
    (:attr:`Measure.lower_is_better`: ``unj_10``); the QA measures (EM, TokenF1, Acc, Judge)
    are better higher."""
    from logicrank.pipelines.evaluation.qa import REGISTRY

    return name not in REGISTRY and parse_measure(name).lower_is_better


def parse_measures(texts: Iterable[str]) -> list[Measure]:
    """Parse all, report all bad names at once, drop repeats keeping order."""
    out: list[Measure] = []
    errors = []
    for t in texts:
        try:
            m = parse_measure(t)
        except MeasureError as exc:
            errors.append(str(exc))
            continue
        if m not in out:
            out.append(m)
    if errors:
        raise MeasureError("; ".join(errors))
    if not out:
        raise MeasureError(f"no measures given; valid: {', '.join(valid_names())}.")
    return out
