"""The nightly job's book-keeping, in any process: a night's state file, the history, the
comparison lines, the night's report and alert texts, what defines a night's numbers (its
digests). jobs/nightly.py runs the steps (the index, retrieve and evaluate jobs on Ray) and
calls these."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logicrank.pipelines.config.retrieval import NIGHTLY_TAG_PREFIX, NightlyConfig, night_date
from logicrank.pipelines.evaluation.history import (
    Night,
    Rule,
    compare_nights,
    history_rows,
    merge_history,
    plot_file,
    plot_history,
)
from logicrank.pipelines.evaluation.measures import lower_is_better
from logicrank.pipelines.files import sha256_file, write_parquet_atomic, write_text_atomic
from logicrank.pipelines.markdown import table
from logicrank.pipelines.operations.alerts import deliver
from logicrank.schemas.digest import json_digest
from logicrank.schemas.errors import UserError

EXIT_REGRESSION = 3  # the night finished and a measure regressed
EXIT_STOPPED = 4  # the re-index (or maintenance) refused: nothing was evaluated, the served tag did not move
TAG = re.compile(rf"{NIGHTLY_TAG_PREFIX}\d{{4}}-\d{{2}}-\d{{2}}")
STEPS = ("index", "maintain", "evaluate", "compare", "serve", "history")


class NightlyError(UserError, RuntimeError):
    """The nightly run cannot start as asked; the message says why."""


@dataclass
class NightResult:
    date: str
    status: str  # ok | regression | stopped
    exit_code: int
    table_version: int | None
    served: dict
    comparisons: pa.Table | None = None
    alert: Path | None = None
    receivers: dict[str, str] = field(default_factory=dict)
    resumed: list[str] = field(default_factory=list)  # steps a previous run of this night had done
    report: Path | None = None


class NightState:
    """A night's record of finished steps: ``<night>/state.json``, rewritten atomically at each
    :meth:`record`; :meth:`done` is a step's record, None while it is not done (or failed)."""

    def __init__(self, night: Path):
        self.path = night / "state.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {"steps": {}}

    def done(self, step: str):
        value = self.data["steps"].get(step)
        return None if isinstance(value, dict) and "failed" in value else value

    def record(self, step: str, value) -> None:
        self.data["steps"][step] = value
        self.save()

    def save(self) -> None:
        write_text_atomic(json.dumps(self.data, indent=2) + "\n", self.path)


def pipeline_hashes(cfg: NightlyConfig) -> dict[str, str]:
    """'<query set>/<pipeline>' -> what defines its numbers apart from the corpus: its stages
    (options, code), the files they read (their content: a decompositions file or a run
    regenerated at the same path), the encoder (a local one's files too), the BM25 analyzer, the
    LLM (its engine, its checkpoint as ``resolve`` identifies it, the prompt templates), the
    queries and qrels. Two nights are
    compared only where it is equal, so whatever else moves their numbers is the corpus."""
    from logicrank.pipelines.engines.bm25.analyzer import analyzer_digest
    from logicrank.pipelines.engines.embed import model_id
    from logicrank.pipelines.engines.vector_models import model_files_digest
    from logicrank.pipelines.retrieval.pipeline import validate
    from logicrank.pipelines.retrieval.runner import stage_classes

    llm = None
    out = {}
    for qs, files in cfg.query_sets.items():
        rcfg = cfg.retrieve_config(qs)
        data = [content_digest(files.queries), content_digest(files.qrels)]
        for name, stages in rcfg.pipelines.items():
            needs = validate(name, stages)
            if needs.llm and llm is None:
                from logicrank.pipelines.llm.models import resolve
                from logicrank.pipelines.llm.prompts import templates_digest

                llm = [cfg.llm.engine_digest(), resolve(cfg.llm.model, log=lambda m: None).model_id, templates_digest()]
            out[f"{qs}/{name}"] = json_digest({
                "stages": [s.model_dump(mode="json") for s in stages], "inputs": data,
                "code": sorted({(c.name, c.version, c.code()) for c in stage_classes(stages)}),
                "files": {f: content_digest(f) for f in sorted(needs.files)},
                "encoder": model_id(cfg.index.embed) if needs.encoder else None,
                "llm": llm if needs.llm else None,
                # what else makes other scores of the same corpus: a local encoder's files (a fine-tune saved over
                # its directory) and the BM25 analyzer's libraries (added where they are, so other hashes stand)
                **({"encoder_files": files_now} if needs.encoder and (files_now := model_files_digest(cfg.index.embed.model)) else {}),
                **({"analyzer": analyzer_digest()} if needs.fulltext else {}),
            })
    return out


def content_digest(path: str) -> str:
    """The content of a file, or of every file under a directory (never their times)."""
    p = Path(path)
    if p.is_dir():
        return json_digest({str(f.relative_to(p)): sha256_file(f) for f in sorted(p.rglob("*")) if f.is_file()})
    return sha256_file(p)


def read_history(root: Path) -> pa.Table | None:
    path = root / "history.parquet"
    return pq.read_table(path) if path.exists() else None


def at_config_notes(hashes: Mapping[str, str], history: pa.Table | None, version: str) -> list[str]:
    """The lines ``nightly --at VERSION`` says where a night that served ``version`` (its tag,
    or its table version) ran a pipeline otherwise than ``hashes`` (:func:`pipeline_hashes`, of
    today's config) define it: numbers printed "at" that night's table then differ from that
    night's history for the config's sake, not the corpus's, and a bisect would blame the corpus."""
    if history is None or history.num_rows == 0:
        return []
    rows = history.select(["date", "table_version", "tag", "query_set", "pipeline", "config_hash"]).to_pylist()
    that = [r for r in rows if r["tag"] == version or str(r["table_version"]) == version]
    then = {f"{r['query_set']}/{r['pipeline']}": (r["date"], r["config_hash"]) for r in sorted(that, key=lambda r: r["date"])}
    return [f"nightly --at {version}: {key} ran otherwise on night {then[key][0]} (its pipeline, encoder, LLM, queries or qrels "
            "changed since): its numbers here are today's config on that table, not that night's" for key in sorted(hashes)
            if key in then and then[key][1] != hashes[key]]


def require_date(day: str) -> None:
    try:
        night_date(day)
    except ValueError as exc:
        raise NightlyError(f"nightly --date: {exc}") from None


def require_inputs(cfg: NightlyConfig, day: str | None = None, baseline: bool = True) -> None:
    """Fail before anything runs: query set files, the pinned baseline's stored night."""
    for qs, files in cfg.query_sets.items():
        for kind, path in (("queries", files.queries), ("qrels", files.qrels)):
            if not Path(path).exists():
                raise NightlyError(f"nightly: query set {qs!r}: no {kind} at {path!r}; check the config.")
    if baseline and cfg.baseline and cfg.baseline < day:
        history = read_history(Path(cfg.out))
        if history is None or cfg.baseline not in set(history.column("date").to_pylist()):
            raise NightlyError(f"nightly: the baseline night {cfg.baseline} is not in {Path(cfg.out) / 'history.parquet'}; "
                               "pin a night that ran (its date), or remove baseline.")


def claim_night(cfg: NightlyConfig, root: Path, day: str, state: NightState) -> None:
    """Refuse to run night ``day`` unless it may run with ``cfg``, then pin ``cfg``'s digests in
    its ``state``. Nights run in date order, and what a night has done keeps its config: after the re-index
    its ``index`` section, after the evaluation all of it (a crash before evaluation can be
    finished with corrected pipelines or query sets)."""
    nights = root / "nights"
    later = sorted(d.name for d in nights.iterdir() if d.name > day and NightState(d).done("index")) if nights.exists() else []
    if later:
        raise NightlyError(f"nightly: night {later[-1]} already ran; nights run in date order. To evaluate an older table "
                           f"version, use --at nightly-{day} (time travel).")
    pinned = [("index", "index_digest", cfg.index_digest(), "index section"), ("evaluate", "config_hash", cfg.night_digest(), "config")]
    for step, key, digest, what in pinned:
        if state.done(step) and state.data.get(key, digest) != digest:
            raise NightlyError(f"nightly: night {day} finished its {step} step with another {what} ({state.data[key]}, this "
                               f"one {digest}); finish it with that config, or run the next night with this one.")
    state.data.update({key: digest for _, key, digest, _ in pinned})
    state.save()


def comparison_lines(table: pa.Table) -> list[str]:
    lines = []
    for r in table.to_pylist():
        if r["regression"]:
            old, new, delta = figures(r)
            lines.append(f"REGRESSION {r['pipeline']} / {r['query_set']} {r['measure']}: {old} -> {new} ({delta}, "
                         f"p {r['p_adjusted']:.3g}) against the {r['against']} "
                         f"night {r['old_date']} (v{r['old_table_version']} -> v{r['new_table_version']})")
    if table.num_rows and not lines:
        compared = table.filter(pc.is_valid(table.column("delta"))).num_rows
        left = table.num_rows - compared
        nights = ", ".join(sorted({str(d) for d in table.column("old_date").to_pylist() if d is not None}))
        if compared == 0:  # (every pair changed or new: "no regression" would read as checked)
            lines.append(f"compare: nothing compared with {nights or 'an earlier night'}: each pipeline and query set changed since, or is "
                         f"new ({left} comparison(s) not made; report.md's notes say why); this night is their new reference")
        else:
            lines.append(f"compare: no regression ({compared} comparison(s) with {nights}"
                         + (f"; {left} not compared, report.md's notes say why)" if left else ")"))
    return lines


def figures(row: Mapping) -> tuple[str, str, str]:
    """A comparison row's old and new values and their change, to four decimals, or to as many
    more (up to ten) as tell the two values apart: a regression past a ``max_drop`` below
    0.0001 printed "0.5000 -> 0.5000 (-0.0000)"."""
    old, new = row["old_value"], row["new_value"]
    places = next((p for p in range(4, 11) if f"{old:.{p}f}" != f"{new:.{p}f}"), 4)
    return f"{old:.{places}f}", f"{new:.{places}f}", f"{row['delta']:+.{places}f}"


def _fmt(v) -> str:
    return "" if v is None else f"{v:.4f}"


def night_depths(root: Path, day: str, query_sets) -> dict[str, dict[str, int]]:
    """Night ``day``'s depth of each run, per query set (query set -> run -> documents per query
    at most), as its evaluations' manifests recorded them (``depths``)."""
    paths = {qs: root / "nights" / day / "sets" / qs / "evaluate" / "manifest.json" for qs in query_sets}
    return {qs: json.loads(p.read_text()).get("depths", {}) if p.exists() else {} for qs, p in paths.items()}


def history_markdown(cfg: NightlyConfig, history: pa.Table, comparisons: pa.Table, day: str, plots: list[Path], root: Path,
                     depths: Mapping[str, Mapping[str, int]]) -> str:
    """The nightly's report.md; ``depths``: night ``day``'s depth of each run per query set (:func:`night_depths`)."""
    from logicrank.pipelines.evaluation.report import DEPTH_NOTE, depth_cell

    nights = sorted(set(history.column("date").to_pylist()))
    lines = [f"# Nightly evaluation: {cfg.index.table} in {cfg.index.db}", "",
             f"{len(nights)} night(s), {nights[0]} to {nights[-1]}; latest written: {day}. History: `history.parquet`.", ""]
    rules = ", ".join(f"{m}: {'rise' if lower_is_better(m) else 'drop'} > {r.max_drop}"
                      + (f" and corrected p < {cfg.alpha}" if r.significant else "") for m, r in cfg.regressions.items())
    lines += [f"Regression rules ({cfg.test}, {cfg.correction} within each measure): {rules or 'none'}.", ""]
    lines += [f"## Night {day}", ""]
    lines += table(["query set", "pipeline", "depth"], ([qs, p, depth_cell(depths.get(qs, {}), p)] for qs in cfg.query_sets for p in cfg.pipelines),
                   "llr")
    lines += ["", DEPTH_NOTE, ""]
    if comparisons.num_rows:
        lines += table(["against", "query set", "pipeline", "measure", "old", "new", "delta", "p (corrected)", "regression", "note"], (
            [f"{r['against']} {r['old_date']} (v{r['old_table_version']})", r["query_set"], r["pipeline"], r["measure"],
             *(figures(r) if r["delta"] is not None else (_fmt(r["old_value"]), _fmt(r["new_value"]), "")),
             "" if r["p_adjusted"] is None else f"{r['p_adjusted']:.3g}",
             "**yes**" if r["regression"] else "", r["note"]] for r in comparisons.to_pylist()))
    else:
        lines.append("Nothing to compare with (the first night).")
    lines += ["", "## History", ""]
    df = history.to_pandas()
    df["run"] = df["pipeline"] + " / " + df["query_set"]
    for measure in cfg.measures:
        wide = df[df["measure"] == measure].pivot(index="date", columns="run", values="value")
        marks = df[df["measure"] == measure].pivot(index="date", columns="run", values="regression").fillna(False)
        plot = next(p for p in plots if p.name == plot_file(measure))
        lines += [f"### {measure}", "", f"![{measure} per night]({plot.relative_to(root)})", ""]
        lines += table(["night", *wide.columns], ([d, *(f"{v:.4f}" + (" **(regression)**" if marks.loc[d, c] else "") if v == v else ""
                                                        for c, v in row.items())] for d, row in wide.iterrows()))
        lines.append("")
    return "\n".join(lines)


def regression_reason(regressions: pa.Table) -> str:
    """One line naming tonight's regressions (the first in full, then how many more)."""
    rows = regressions.to_pylist()
    r = rows[0]
    old, new, _ = figures(r)
    first = f"{r['pipeline']} / {r['query_set']} {r['measure']} {old} -> {new} (p {r['p_adjusted']:.3g}) against the {r['against']} night {r['old_date']}"
    return f"{len(rows)} regression(s): {first}" + (f", and {len(rows) - 1} more" if len(rows) > 1 else "")


def serve_message(served: dict | None) -> str | None:
    """What the serve step did with the served tag on a night that regressed (None: it moved as usual)."""
    if not served or not served.get("held"):
        if served and served.get("promoted_on_regression"):
            return (f"The served tag {served['tag']!r} moved to tonight's v{served['version']} despite the regression "
                    "(promote_on_regression: true).")
        return None
    if served.get("version") is None:
        where = "stays unset (no night has been served yet)"
    else:
        night = f", night {served['last_good_night']}" if served.get("last_good_night") else ""
        where = f"was held on v{served['version']} (the last good version{night})"
    return (f"The served tag {served['tag']!r} {where}: tonight's v{served['tonight']} is not served because the comparison found "
            f"{served['reason']}. Downstream readers of the tag keep the last good version; to serve tonight's anyway, move the tag "
            "(docs/operations.md), or set promote_on_regression: true for the nights to come.")


def alert_markdown(alert: dict) -> str:
    t = alert["table"]
    served = alert["served"]
    lines = [f"# logicrank nightly {alert['date']}: {alert['status'].upper()}", ""]
    if alert["message"]:
        lines += [alert["message"], ""]
    held = served.get("held")
    lines += [f"- table: `{t['name']}` in `{t['db']}`, tonight v{t['version']} ({t['tag']})" if t["version"] is not None
              else f"- table: `{t['name']}` in `{t['db']}`: no new version tonight",
              f"- served tag `{served['tag']}`: " + (f"**held on v{served.get('version')}** (the last good version; tonight's "
                                                      f"v{served.get('tonight')} is not served)" if held else f"v{served.get('version')}")]
    for against, old in alert["compared_with"].items():
        lines.append(f"- compared with the {against} night {old['date']} (v{old['table_version']})")
    if alert.get("history_error"):
        lines.append(f"- {alert['history_error']}")
    if alert["regressions"]:
        lines += [""] + table(["query set", "pipeline", "measure", "against", "old", "new", "delta", "p (corrected)", "table versions"], (
            [r["query_set"], r["pipeline"], r["measure"], f"{r['against']} {r['old_date']}", *figures(r),
             f"{r['p_adjusted']:.3g}", f"v{r['old_table_version']} -> v{r['new_table_version']}"] for r in alert["regressions"]))
    lines += ["", f"Report: `{alert['report']}`", ""]
    return "\n".join(lines)


class NightBook:
    """A night's book-keeping over its directory ``root/nights/<day>``: the nights it compares
    with (read from the history), the comparison, the history rows, the report, the alert and
    where the served tag points; no Ray, no job. jobs/nightly.py's ``NightRun`` adds the steps
    that run jobs."""

    def __init__(self, cfg: NightlyConfig, root: Path, day: str, state: NightState, say: Callable[[str], None], progress: bool):
        self.cfg, self.root, self.day, self.state, self.progress = cfg, root, day, state, progress
        self.night = root / "nights" / day
        self.tag = f"{NIGHTLY_TAG_PREFIX}{day}"
        self.say = lambda m: say(f"nightly {day}: {m}")

    def _night_of(self, version: int | None) -> str | None:
        """The night of the history whose table version this is (the newest such), if any."""
        history = read_history(self.root)
        if version is None or history is None:
            return None
        days = history.filter(pc.equal(history.column("table_version"), version)).column("date").to_pylist()
        return max(days) if days else None

    def _load(self, day: str, version: int, hashes: dict[str, str]) -> Night:
        """A night's per-query metrics; refused when the files of a query set it evaluated are gone
        (a comparison that silently skipped them could never flag a regression)."""
        metrics = {}
        for qs in sorted({k.split("/", 1)[0] for k in hashes} & set(self.cfg.query_sets)):
            path = self.root / "nights" / day / "sets" / qs / "evaluate" / "metrics.parquet"
            if not path.exists():
                raise NightlyError(f"nightly: night {day} is in the history but its per-query metrics {path} are gone; "
                                   "restore them, or remove that night's rows from history.parquet to stop comparing with it.")
            metrics[qs] = pq.read_table(path)
        pairs = {tuple(k.split("/", 1)): v for k, v in hashes.items()}
        return Night(day, version, metrics, pairs)

    def _tonight(self) -> Night:
        ev = self.state.done("evaluate")
        return self._load(self.day, ev["version"], ev["hashes"])

    def _stored(self, day: str) -> Night:
        """An earlier night, as the history recorded it."""
        h = read_history(self.root)
        rows = h.filter(pc.equal(h.column("date"), day)).to_pylist() if h is not None else []
        if not rows:
            raise NightlyError(f"nightly: night {day} is not in {self.root / 'history.parquet'}; nothing to compare with.")
        hashes = {f"{r['query_set']}/{r['pipeline']}": r["config_hash"] for r in rows}
        return self._load(day, rows[0]["table_version"], hashes)

    def _compare(self) -> None:
        cfg, new = self.cfg, self._tonight()
        rules = {m: Rule(r.max_drop, r.significant) for m, r in cfg.regressions.items()}
        history = read_history(self.root)
        dates = sorted({d for d in history.column("date").to_pylist() if d < self.day}) if history is not None else []
        # a night held on a regression (the tag kept on another version than its own), unless the served tag was moved to its
        # version since (by hand): then it is served
        served = self._served().get("version") if dates else None
        records = {d: NightState(self.root / "nights" / d).done("serve") or {} for d in dates}
        held = [d for d, r in records.items() if r.get("held") and not (r.get("tonight") == served != r.get("version"))]
        earlier = [d for d in dates if d not in held]  # the nights served: tonight's reference is the last of them
        if held and earlier and held[-1] > earlier[-1]:
            self.say(f"compare: night(s) {', '.join(d for d in held if d > earlier[-1])} held on a regression (not served): "
                     f"compared with {earlier[-1]}, the last night served")
        baseline = cfg.baseline if cfg.baseline and cfg.baseline < self.day and cfg.baseline not in earlier[-1:] else None
        # (a baseline that is also the previous night is compared once, as the previous)
        previous = self._stored(earlier[-1]) if earlier else None
        pinned = self._stored(baseline) if baseline else None
        since = self._first_nights_as_tonight(history, previous, new)
        table = compare_nights(previous, new, rules, pinned, cfg.test, cfg.correction, cfg.alpha, since=since)
        write_parquet_atomic(table, self.night / "comparisons.parquet")
        self.state.record("compare", {"previous": earlier[-1] if earlier else None, "baseline": baseline,
                                      "regressions": int(pc.sum(table.column("regression")).as_py() or 0)})
        for line in comparison_lines(table):
            self.say(line)
        if previous is None and pinned is None:
            self.say("compare: the first night of the history; nothing to compare with")

    def _first_nights_as_tonight(self, history, previous: Night | None, new: Night) -> dict[tuple[str, str], Night]:
        """For each (query set, pipeline) the previous night (the last served) ran otherwise or
        not at all, the first held night since that ran it as tonight: its reference. That night
        was "the new reference" of the pair, and a night held on another pair's regression is
        never served, so without it a changed pair would go uncompared until a night was served,
        a regression of it meanwhile served unseen."""
        if previous is None or history is None:
            return {}
        changed = {key: h for key, h in new.hashes.items() if previous.hashes.get(key) != h}
        rows = history.filter(pc.and_(pc.greater(history.column("date"), previous.date), pc.less(history.column("date"), self.day)))
        first: dict[tuple[str, str], str] = {}
        for r in sorted(rows.select(["date", "query_set", "pipeline", "config_hash"]).to_pylist(), key=lambda r: r["date"]):
            key = (r["query_set"], r["pipeline"])
            if key in changed and key not in first and r["config_hash"] == changed[key]:
                first[key] = r["date"]
        nights = {day: self._stored(day) for day in set(first.values())}
        return {key: nights[day] for key, day in first.items()}

    def _history(self) -> None:
        comparisons = pq.read_table(self.night / "comparisons.parquet")
        merged = merge_history(read_history(self.root), history_rows(self._tonight(), self.tag, comparisons))
        write_parquet_atomic(merged, self.root / "history.parquet")
        self.state.record("history", {"rows": merged.num_rows, "nights": len(set(merged.column("date").to_pylist()))})

    # -- what people read -----------------------------------------------------------------
    def _report(self) -> Path:
        history = read_history(self.root)
        plots = [plot_history(history, m, self.root / "plots" / plot_file(m)) for m in self.cfg.measures]
        comparisons = pq.read_table(self.night / "comparisons.parquet")
        depths = night_depths(self.root, self.day, self.cfg.query_sets)
        path = write_text_atomic(history_markdown(self.cfg, history, comparisons, self.day, plots, self.root, depths), self.root / "report.md")
        self.say(f"history: {len(set(history.column('date').to_pylist()))} night(s); report {path}")
        return path

    def _alert(self, status: str, code: int, regressions: pa.Table | None = None, served: dict | None = None,
               step: str | None = None, message: str | None = None) -> tuple[Path, dict[str, str]]:
        index = self.state.done("index") or {}
        compare = self.state.done("compare") or {}
        old_versions, history_error = {}, None
        try:
            history = read_history(self.root)
            for against in ("previous", "baseline"):
                if compare.get(against) and history is not None:
                    rows = history.filter(pc.equal(history.column("date"), compare[against]))
                    old_versions[against] = {"date": compare[against], "table_version": rows.column("table_version")[0].as_py()}
        except Exception as exc:  # noqa: BLE001 (the alert goes out without them; it was filed under compared_with, whose
            # rendering then failed before any receiver was called: a corrupt history's failed night alerted no one)
            old_versions, history_error = {}, f"the history could not be read: {type(exc).__name__}: {exc}"
        alert = {
            "date": self.day, "status": status, "exit_code": code, "step": step, "message": message,
            "table": {"db": self.cfg.index.db, "name": self.cfg.index.table, "version": index.get("version"), "tag": index.get("tag")},
            "compared_with": old_versions,
            **({"history_error": history_error} if history_error else {}),
            "served": served if served is not None else self._served(),
            "regressions": regressions.to_pylist() if regressions is not None else [],
            "report": str(self.root / "report.md"),
            "night": str(self.night),
        }
        path = write_text_atomic(json.dumps(alert, indent=2) + "\n", self.night / "alert.json")
        write_text_atomic(alert_markdown(alert), self.night / "alert.md")
        # A regression alert reaches each receiver once per night (a rerun retries only the ones
        # that failed); a stopped or failed run is news each time it happens.
        sent = self.state.data.setdefault("receivers", {}) if status == "regression" else {}
        results = deliver(alert, self.cfg.alert, skip=frozenset(r for r, v in sent.items() if v.startswith("ok")))
        if status == "regression":
            sent.update(results)
            self.state.save()
        for receiver, result in results.items():
            self.say(f"alert {receiver}: {result}")
        return path, {**sent, **results}

    def _clear_alert(self) -> None:
        for name in ("alert.json", "alert.md"):
            (self.night / name).unlink(missing_ok=True)

    def _served(self) -> dict:
        """Where the served tag points now (read from the table)."""
        from logicrank.pipelines.engines.store import DocStore

        try:
            store = DocStore(self.cfg.index.db, self.cfg.index.table)
            version = store.tagged_version(self.cfg.served_tag) if store.exists() else None
        except Exception as exc:  # noqa: BLE001 (an alert must go out even when the table cannot be read)
            return {"tag": self.cfg.served_tag, "version": None, "error": str(exc)}
        return {"tag": self.cfg.served_tag, "version": version}
