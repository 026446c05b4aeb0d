"""The nightly job's book-keeping, in any process: a night's state file, the history, the
comparison lines, the night's report and alert texts, what defines a night's numbers (its
digests). jobs/nightly.py runs the steps (the index, retrieve and evaluate jobs on Ray) and
calls these."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logicrank.pipelines.config import NIGHTLY_TAG_PREFIX, NightlyConfig, night_date
from logicrank.pipelines.evaluate.history import plot_file
from logicrank.pipelines.files import sha256_file, write_text_atomic
from logicrank.pipelines.markdown import table
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
    """'<query set>/<pipeline>' -> what defines its numbers apart from the corpus: its stages,
    the encoder and LLM it uses, the queries and qrels."""
    from logicrank.pipelines.embed import model_id
    from logicrank.pipelines.pipeline import validate

    out = {}
    for qs, files in cfg.query_sets.items():
        rcfg = cfg.retrieve_config(qs)
        data = [content_digest(files.queries), content_digest(files.qrels)]
        for name, stages in rcfg.pipelines.items():
            needs = validate(name, stages)
            out[f"{qs}/{name}"] = json_digest({
                "stages": [s.model_dump(mode="json") for s in stages], "inputs": data,
                "encoder": model_id(cfg.index.embed) if needs.encoder else None,
                "llm": cfg.llm.engine_digest() if needs.llm else None,
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
            lines.append(f"REGRESSION {r['pipeline']} / {r['query_set']} {r['measure']}: {r['old_value']:.4f} -> "
                         f"{r['new_value']:.4f} ({r['delta']:+.4f}, p {r['p_adjusted']:.3g}) against the {r['against']} "
                         f"night {r['old_date']} (v{r['old_table_version']} -> v{r['new_table_version']})")
    if table.num_rows and not lines:
        compared = table.filter(pc.is_valid(table.column("delta"))).num_rows
        lines.append(f"compare: no regression ({compared} comparison(s) with {', '.join(sorted(set(table.column('old_date').to_pylist())))})")
    return lines


def _fmt(v) -> str:
    return "" if v is None else f"{v:.4f}"


def _signed(v) -> str:
    return "" if v is None else f"{v:+.4f}"


def history_markdown(cfg: NightlyConfig, history: pa.Table, comparisons: pa.Table, day: str, plots: list[Path], root: Path) -> str:
    nights = sorted(set(history.column("date").to_pylist()))
    lines = [f"# Nightly evaluation: {cfg.index.table} in {cfg.index.db}", "",
             f"{len(nights)} night(s), {nights[0]} to {nights[-1]}; latest written: {day}. History: `history.parquet`.", ""]
    rules = ", ".join(f"{m}: drop > {r.max_drop}" + (f" and corrected p < {cfg.alpha}" if r.significant else "")
                      for m, r in cfg.regressions.items())
    lines += [f"Regression rules ({cfg.test}, {cfg.correction} within each measure): {rules or 'none'}.", ""]
    lines += [f"## Night {day}", ""]
    if comparisons.num_rows:
        lines += table(["against", "query set", "pipeline", "measure", "old", "new", "delta", "p (corrected)", "regression", "note"], (
            [f"{r['against']} {r['old_date']} (v{r['old_table_version']})", r["query_set"], r["pipeline"], r["measure"], _fmt(r["old_value"]),
             _fmt(r["new_value"]), _signed(r["delta"]), "" if r["p_adjusted"] is None else f"{r['p_adjusted']:.3g}",
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
    first = (f"{r['pipeline']} / {r['query_set']} {r['measure']} {r['old_value']:.4f} -> {r['new_value']:.4f} "
             f"(p {r['p_adjusted']:.3g}) against the {r['against']} night {r['old_date']}")
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
    if alert["regressions"]:
        lines += [""] + table(["query set", "pipeline", "measure", "against", "old", "new", "delta", "p (corrected)", "table versions"], (
            [r["query_set"], r["pipeline"], r["measure"], f"{r['against']} {r['old_date']}", f"{r['old_value']:.4f}", f"{r['new_value']:.4f}",
             f"{r['delta']:+.4f}", f"{r['p_adjusted']:.3g}", f"v{r['old_table_version']} -> v{r['new_table_version']}"] for r in alert["regressions"]))
    lines += ["", f"Report: `{alert['report']}`", ""]
    return "\n".join(lines)
