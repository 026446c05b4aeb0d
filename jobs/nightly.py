"""`logicrank nightly CONFIG.yaml`: one night of operations, as one resumable command.

Steps, in order, each recorded in ``<out>/nights/<date>/state.json`` when done (a rerun of
the night skips what is done and finishes the rest):

1. index: the corpus snapshot into the table, incrementally (jobs/index.py: snapshot guard,
   single-writer lock, compaction, indexes over every row); the version is tagged
   ``nightly-<date>``. A refusal (too many rejects, the delete guard, a held lock) stops the
   night here: no evaluation, the served tag stays where it was, and the alert says so.
2. maintain: drop nightly tags past the newest ``keep_nightly_tags`` (never tonight's or the
   pinned baseline's), then prune untagged versions past the retention.
3. evaluate: every pipeline on every query set against tonight's table version
   (`logicrank retrieve` + `logicrank evaluate`, each skipping work already done).
4. compare: with the previous night served (a night held on a regression is skipped, so a
   corruption that persists is found again, not taken as the new normal) and the pinned
   baseline night: paired
   tests, corrected within each measure, and each measure's regression rule
   (pipelines/evaluation/history.py).
5. serve: move the served tag to tonight's version, unless the comparison found a
   regression: then the tag stays on the last good version (the one it served before
   tonight), the step records it as held (a rerun of the night never moves it), and the
   alert says so. ``promote_on_regression: true`` moves it anyway, as before.
6. history: tonight's rows replace any rows of the same date in ``history.parquet`` (so a
   rerun never appends twice); plots and ``report.md`` are redrawn.
7. alert: on a regression, ``alert.json`` + ``alert.md`` in the night's directory and each
   configured receiver called once (one that failed is tried again by a rerun).

Exit codes (:data:`EXIT_REGRESSION`, :data:`EXIT_STOPPED`) let cron and Kubernetes tell a
regression from a stopped night from a crash. Only one nightly run per ``out`` at a time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from logicrank.jobs.watchdog import beat, busy
from logicrank.pipelines.config.retrieval import NIGHTLY_TAG_PREFIX, NightlyConfig
from logicrank.pipelines.operations.nightly import (
    EXIT_REGRESSION,
    EXIT_STOPPED,
    STEPS,
    TAG,
    NightBook,
    NightlyError,
    NightResult,
    NightState,
    at_config_notes,
    claim_night,
    pipeline_hashes,
    read_history,
    regression_reason,
    require_date,
    require_inputs,
    serve_message,
)
from logicrank.pipelines.operations.writelock import Holder, TableLock
from logicrank.schemas.errors import UserError


class _Stopped(Exception):
    """A step that changes the table refused; the night ends before evaluation."""

    def __init__(self, step: str, message: str):
        super().__init__(message)
        self.step = step


class NightlyLock(TableLock):
    """One nightly run per nightly directory ``root`` (the kernel lock of jobs' table writers);
    a second one is refused with a :class:`NightlyError` naming the holder."""

    def __init__(self, root: Path):
        super().__init__(str(root), "nightly", "nightly")

    def _refuse(self, holder: Holder | None) -> NightlyError:
        who = holder.describe() if holder else "another process"
        return NightlyError(f"nightly: {self.db} is in use by another nightly run ({who}); one at a time. Wait for it, then run again.")


def run_nightly(cfg: NightlyConfig, day: str | None = None, echo: Callable[[str], None] | None = None,
                progress: bool = False) -> NightResult:
    """Run (or finish) the night of ``day`` (YYYY-MM-DD, default today in UTC)."""
    say = echo or (lambda m: None)
    day = day or datetime.now(UTC).date().isoformat()
    require_date(day)
    require_inputs(cfg, day)
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    with NightlyLock(root):
        night = root / "nights" / day
        state = NightState(night)
        claim_night(cfg, root, day, state)
        from logicrank.jobs.raysession import ray_session

        with ray_session(cfg.index.ray):
            return NightRun(cfg, root, day, state, say, progress).run()


def run_at(cfg: NightlyConfig, version: str, echo: Callable[[str], None] | None = None, progress: bool = False) -> dict[str, pa.Table]:
    """Time travel: the configured pipelines on every query set against table ``version`` (a
    tag such as ``nightly-2026-11-20``, or a number); writes ``<out>/at/<version>/``, touches
    neither the table nor the history. Returns query set -> metrics."""
    from logicrank.jobs.evaluate import run_evaluate
    from logicrank.jobs.raysession import ray_session
    from logicrank.jobs.retrieve import run_retrieve

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", version):
        raise NightlyError(f"nightly --at {version!r}: a table version is a number or a tag name.")
    require_inputs(cfg, baseline=False)
    for line in at_config_notes(pipeline_hashes(cfg), read_history(Path(cfg.out)), version):
        (echo or (lambda m: None))(line)
    # a tag resolved once: every query set reads one version, though the night (or an index run) moves the tag meanwhile
    pinned = _pinned_version(cfg, version)
    out = {}
    with ray_session(cfg.index.ray):
        for qs in cfg.query_sets:
            where = Path(cfg.out) / "at" / version / "sets" / qs
            runs = run_retrieve(cfg.retrieve_config(qs, pinned), where / "retrieve", echo=echo, progress=progress)
            out[qs] = run_evaluate(cfg.evaluate_config(qs, tuple(str(runs[p]) for p in cfg.pipelines)), where / "evaluate",
                                   title=f"{qs} at table version {version}")
    return out


def _pinned_version(cfg: NightlyConfig, version: str) -> int | str:
    """The table version ``version`` (a number, or a tag) names now, as a number; as given where
    the table cannot be opened at it (retrieve says why, in one line)."""
    from logicrank.pipelines.engines.store import DocStore

    try:
        return int(DocStore(cfg.index.db, cfg.index.table, version=version).version)
    except Exception:  # noqa: BLE001 (no table, no such tag or version: the retrieve job's own refusal names it)
        return version


class NightRun(NightBook):
    """One night's steps (:data:`STEPS`) run in order by :meth:`run`, each skipped when its
    record in ``state`` says it is done; then the alert and the report. The steps that run
    jobs on the cluster (index, maintain, serve, evaluate) are here; comparing, the history,
    the report and the alert are its :class:`~logicrank.pipelines.operations.nightly.NightBook`'s. Made
    by :func:`run_nightly` inside the nightly lock and a Ray session."""


    def run(self) -> NightResult:
        resumed = [s for s in STEPS if self.state.done(s)]
        if resumed:
            self.say(f"resuming; done before: {', '.join(resumed)}")
        step = STEPS[0]
        try:
            try:
                for step in STEPS:
                    if not self.state.done(step):
                        getattr(self, f"_{step}")()
                        beat(f"nightly {self.day}: {step} done")
            except _Stopped as stop:
                return self._stopped(stop, resumed)
            step = "alert"
            comparisons = pq.read_table(self.night / "comparisons.parquet")
            regressions = comparisons.filter(comparisons.column("regression"))
            served = self.state.done("serve")
            if regressions.num_rows:  # sent before the report is drawn: a plotting failure cannot hold it back
                alert, receivers = self._alert("regression", EXIT_REGRESSION, regressions=regressions, served=served,
                                               message=serve_message(served))
                status, code = "regression", EXIT_REGRESSION
            else:
                self._clear_alert()  # a clean finish after a failed or stopped run: no stale alert left behind
                alert, receivers, status, code = None, {}, "ok", 0
            step = "report"
            report = self._report()
        except Exception as exc:  # a crash: say so to the receivers, then fail as before (a rerun resumes)
            try:
                self._alert("failed", 1, step=step, message=f"{type(exc).__name__}: {exc}")
            except Exception as also:  # noqa: BLE001 (the crash itself is what must surface)
                self.say(f"could not write or send the alert of this failure: {type(also).__name__}: {also}")
            raise
        return NightResult(self.day, status, code, self.state.done("index")["version"], served, comparisons, alert, receivers, resumed, report)

    # -- steps that change the table ------------------------------------------------------
    def _index(self) -> None:
        from logicrank.jobs.index import run_index

        try:
            s = run_index(self.cfg.index.model_copy(update={"tag": self.tag}), self.night / "index", progress=self.progress)
        except UserError as exc:
            self.state.record("index", {"failed": str(exc)})
            raise _Stopped("index", str(exc)) from None
        self.state.record("index", {"version": s.table_version, "tag": s.tag, "rows": s.table_rows, "inserted": s.inserted,
                                    "updated": s.updated, "deleted": s.deleted, "unchanged": s.unchanged, "rejected": s.rejected})
        self.say(f"index: inserted {s.inserted}, updated {s.updated}, deleted {s.deleted}, unchanged {s.unchanged}, "
                 f"rejected {s.rejected}; table v{s.table_version} ({s.table_rows} rows) tagged {s.tag}")

    def _maintain(self) -> None:
        from logicrank.pipelines.engines.store import DocStore, maintain_apart

        keep = {self.tag} | ({f"{NIGHTLY_TAG_PREFIX}{self.cfg.baseline}"} if self.cfg.baseline else set())
        try:
            with TableLock(self.cfg.index.db, self.cfg.index.table, "nightly"):
                store = DocStore(self.cfg.index.db, self.cfg.index.table)
                names = sorted(n for n in store.table.tags.list() if TAG.fullmatch(n) and n <= self.tag)
                dropped = [n for n in names[: max(0, len(names) - self.cfg.keep_nightly_tags)] if n not in keep]
                for name in dropped:
                    store.table.tags.delete(name)
                with busy(f"nightly {self.day}: maintaining the table"):
                    m = maintain_apart(store, self.cfg.index.ann_from(), timedelta(hours=self.cfg.index.prune_after_hours), changed=False)
        except UserError as exc:
            self.state.record("maintain", {"failed": str(exc)})
            raise _Stopped("maintain", str(exc)) from None
        self.state.record("maintain", {"tags_dropped": dropped, **m})
        self.say(f"maintain: {len(dropped)} old nightly tag(s) dropped, {m['versions_pruned']} version(s) pruned, "
                 f"{m['versions_left']} kept; rows outside an index: {sum(m['unindexed_rows'].values())}")

    def _serve(self) -> None:
        """Move the served tag to tonight's version: its re-index succeeded and its comparison
        found no regression. A regression holds the tag on the version it served before
        tonight (the last good one), unless ``promote_on_regression``; the record says which,
        and a rerun of the night skips this step, so a held night is never promoted later."""
        from logicrank.pipelines.engines.store import DocStore

        version, tag = self.state.done("index")["version"], self.cfg.served_tag
        comparisons = pq.read_table(self.night / "comparisons.parquet")
        regressions = comparisons.filter(comparisons.column("regression"))
        hold = regressions.num_rows > 0 and not self.cfg.promote_on_regression
        with TableLock(self.cfg.index.db, self.cfg.index.table, "nightly"):
            store = DocStore(self.cfg.index.db, self.cfg.index.table)
            if hold:
                kept = store.tagged_version(tag)
            else:
                store.tag(tag, version)
        if hold:
            record = {"tag": tag, "version": kept, "held": True, "tonight": version, "last_good_night": self._night_of(kept),
                      "reason": regression_reason(regressions)}
        else:
            record = {"tag": tag, "version": version, "held": False, "tonight": version}
            if regressions.num_rows:
                record["promoted_on_regression"] = True
        self.state.record("serve", record)
        if hold:
            night = f", night {record['last_good_night']}" if record["last_good_night"] else ""
            where = f"stays on v{kept} (the last good version{night})" if kept is not None else "stays unset (no night served yet)"
            self.say(f"serve: HELD: tag {tag!r} {where}; tonight's v{version} is not served: {record['reason']}")
        else:
            self.say(f"serve: tag {tag!r} now v{version}" + (" (promote_on_regression: moved despite the regression)" if regressions.num_rows else ""))


    # -- evaluation and comparison --------------------------------------------------------
    def _evaluate(self) -> None:
        from logicrank.jobs.evaluate import run_evaluate
        from logicrank.jobs.retrieve import run_retrieve
        from logicrank.pipelines.evaluation.report import summary_frame

        version = self.state.done("index")["version"]
        for qs in self.cfg.query_sets:
            where = self.night / "sets" / qs
            runs = run_retrieve(self.cfg.retrieve_config(qs, version), where / "retrieve", echo=self.say if self.progress else None,
                                progress=self.progress)
            metrics = run_evaluate(self.cfg.evaluate_config(qs, tuple(str(runs[p]) for p in self.cfg.pipelines)), where / "evaluate",
                                   title=f"Nightly {self.day}: {qs} (table v{version})")
            frame = summary_frame(metrics)
            self.say(f"evaluate {qs}: " + "; ".join(
                f"{rid} " + ", ".join(f"{m} {frame.loc[rid, m]:.4f}" for m in self.cfg.measures if m in frame.columns) for rid in frame.index))
        self.state.record("evaluate", {"hashes": pipeline_hashes(self.cfg), "version": version})


    def _stopped(self, stop: _Stopped, resumed: list[str]) -> NightResult:
        served = self._served()
        where = f"v{served['version']}" if served.get("version") is not None else "no version yet (no night has succeeded)"
        message = (f"the {stop.step} step refused, so the night stopped before evaluation; the served tag "
                   f"{served['tag']!r} stays at {where}. {stop}")
        alert, receivers = self._alert("stopped", EXIT_STOPPED, served=served, step=stop.step, message=message)
        self.say(f"STOPPED: {message}")
        return NightResult(self.day, "stopped", EXIT_STOPPED, None, served, None, alert, receivers, resumed)


