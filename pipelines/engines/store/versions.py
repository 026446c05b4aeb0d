"""The table's versions: the current one, when each was made, tags, restoring an old version,
dropping old tags so their versions can be pruned; which version a completed index run
finished, and so which one a reader reads by default.

The record of completion lives with the table, not in a job's run directory (retrieve runs
elsewhere, with another ``--out``): a reserved LanceDB tag, :data:`COMPLETE_TAG`, that the
index job moves to the version it finished, as its last change to the table. A run that is
interrupted or fails leaves the tag where it was, so readers keep reading the last complete
version (:meth:`Versions.readable_version`); a first index that never completed has no
complete version and is refused. Maintenance (compaction, index builds) and a restore of a
complete version carry the mark to the version they make, which holds the same documents.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from logicrank.pipelines.engines.store.base import _META_EMBEDDED_BY, StoreError

COMPLETE_TAG = "logicrank-complete"  # the newest version a completed index run finished (moved by each such run)
EMBEDDED_BY = "logicrank-embedded-by-"  # + the digest of the code that embedded the table's vectors (pipelines.codedigest)
# the record of a version restored from before its table recorded the code in each version: no code's digest equals it,
# so the next index run embeds every document again rather than trust vectors of unknown making
UNKNOWN_EMBEDDED_BY = "unknown"


def tag_problem(name: str) -> str | None:
    """Why ``name`` cannot be a user's tag of a table version, or None: Lance's rule for a ref
    (letters, digits, '.', '-', '_'; no leading or trailing dot, no '..', no '.lock' ending),
    a name short enough for a file, and none of the names this project keeps for itself."""
    if not name or len(name) > 200:
        return "a tag has 1 to 200 characters"
    if not all(c.isalnum() or c in "._-" for c in name):
        return "a tag has only letters, digits, '.', '-' and '_'"
    if name.startswith(".") or name.endswith(".") or ".." in name or name.endswith(".lock"):
        return "a tag neither starts nor ends with a dot, holds no '..' and does not end with '.lock'"
    if name.isdigit():
        return "a tag of digits alone would read as a version number (--table-version 3 reads version 3)"
    if name == COMPLETE_TAG or name.startswith(EMBEDDED_BY):
        return f"{COMPLETE_TAG!r} and {EMBEDDED_BY}... are the index job's own tags"
    return None


def utc_stamp(made: datetime) -> str:
    """LanceDB's time of a version (local time, no zone) in UTC, to the microsecond."""
    return made.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%fZ")


class Versions:
    """The versions side of :class:`logicrank.pipelines.engines.store.DocStore`."""

    @property
    def version(self) -> int:
        return int(self.table.version)

    def version_stamps(self) -> dict[int, str]:
        """Version -> when it was made, in UTC (``2026-12-04 14:22:06.063575Z``), for every
        version kept (a table dropped and made again reuses version numbers, not times). LanceDB
        gives local time without a zone; a saved index and a stage cache keyed by that would be
        another table's to a process in another time zone."""
        return {int(v["version"]): utc_stamp(v["timestamp"]) for v in self.table.list_versions()}

    def version_stamp(self) -> str:
        """When the current version was made; asked once per table object and version (every
        search keys its stages by it, and listing the versions reads each one's manifest)."""
        version, memo = self.version, getattr(self, "_stamp_memo", None)
        if memo is None or memo[0] is not self.table or memo[1] != version:
            memo = (self.table, version, self.version_stamps().get(version, ""))
            self._stamp_memo = memo
        return memo[2]

    def version_made(self) -> float:
        """When the current version was made, in seconds since the epoch: the same in every
        time zone."""
        made = next((v["timestamp"] for v in self.table.list_versions() if int(v["version"]) == self.version), None)
        return round(made.timestamp(), 6) if made is not None else 0.0

    def version_rows(self) -> list[dict]:
        """Every version kept, oldest first: ``version``, ``made`` (when), ``rows``, ``tags`` (the
        user's and the index job's, not the reserved marks), ``state`` and ``read`` (the one
        readers read by default, :meth:`readable_version`; none when no run completed).

        ``state`` is what the table records, no more: ``complete`` for the version the
        :data:`COMPLETE_TAG` names and any tagged one (every tag names a version a completed run
        finished); ``incomplete`` for a version newer than the mark, or any version of a table
        with no tag at all (no run on it completed); ``unrecorded`` for an untagged one before
        the mark (or on a table from before the mark): a completed run's whose tag was dropped
        (:meth:`drop_old_tags`) or a commit a run made on its way, which the table cannot tell apart."""
        tags: dict[int, list[str]] = {}
        for name, v in self.table.tags.list().items():
            tags.setdefault(int(v["version"]), []).append(name)
        mark = self.complete_version()

        def state(v: int) -> str:
            if v in tags:
                return "complete"
            return "incomplete" if not tags or (mark is not None and v > mark) else "unrecorded"

        try:
            read = self.readable_version("versions")[0]
        except StoreError:
            read = None
        ds = self.table.to_lance()
        return [{"version": v, "made": made, "rows": int(ds.checkout_version(v).count_rows()),
                 "tags": sorted(n for n in tags.get(v, []) if n != COMPLETE_TAG and not n.startswith(EMBEDDED_BY)),
                 "state": state(v), "read": v == read}
                for v, made in sorted(self.version_stamps().items())]

    def drop_old_tags(self, pattern: re.Pattern[str], keep: int) -> list[str]:
        """Delete all but the newest ``keep`` tags whose whole name matches ``pattern`` (names
        that sort by time), so their versions can be pruned later; any other tag is never
        touched. Returns those dropped."""
        tags = self.table.tags
        names = sorted(n for n in tags.list() if pattern.fullmatch(n))
        dropped = names[: max(0, len(names) - keep)]
        for name in dropped:
            tags.delete(name)
        return dropped

    def restore(self, version: int | str) -> int:
        """Make ``version`` (a number or a tag) the latest version again; returns the new version.

        The new version holds the documents of ``version``, and its schema, so the record of the
        code that made their vectors (:meth:`embedded_by`; :data:`UNKNOWN_EMBEDDED_BY` for a version
        older than the table's first record): it is marked complete when that one
        was (the version :data:`COMPLETE_TAG` names, or one a completed run tagged)."""
        t = self.table
        versions = [v["version"] for v in t.list_versions()]
        tags = t.tags.list()
        if version not in versions and version not in tags:
            raise StoreError(
                f"store: table {self.name!r} has no version {version!r}; versions kept: {versions[-10:]}, tags: {sorted(tags)[-10:]}."
            )
        number = int(tags[version]["version"]) if version in tags else int(version)
        complete = number in {int(v["version"]) for v in tags.values()}  # every tag names a version a completed run finished
        recorded = self.embedded_by()
        t.restore(version)
        if recorded is not None and self.embedded_by() is None:
            # a version from before the table recorded its embedding code in each version (the older
            # tags were dropped when it began): what made its vectors is not known
            self.mark_embedded_by(UNKNOWN_EMBEDDED_BY)
        if complete:
            self.mark_complete()
        return self.version

    def tag(self, name: str, version: int | None = None) -> None:
        """Point tag ``name`` at ``version`` (default the latest), creating or moving it."""
        tags = self.table.tags
        version = self.version if version is None else version
        if name in tags.list():
            tags.update(name, version)
        else:
            tags.create(name, version)

    def tagged_version(self, name: str) -> int | None:
        """The version tag ``name`` points at, or None without such a tag."""
        tags = self.table.tags
        return int(tags.get_version(name)) if name in tags.list() else None

    # -- completion -----------------------------------------------------------------
    def mark_complete(self, version: int | None = None) -> None:
        """Record ``version`` (default the latest) as finished by a completed index run: readers
        read it by default (:meth:`readable_version`)."""
        self.tag(COMPLETE_TAG, version)

    def embedded_by(self) -> str | None:
        """The digest of the code that embedded the vectors of this version (``pipelines.engines.embed``
        and what it imports, :func:`logicrank.pipelines.codedigest.code_digest`): in the version's
        schema, so a version restored brings back its own; where that holds none (a table indexed
        before it did), the last completed run's tag; None where the table holds no record."""
        value = (self.table.schema.metadata or {}).get(_META_EMBEDDED_BY)
        if value is not None:
            return value.decode()
        names = [n for n in self.table.tags.list() if n.startswith(EMBEDDED_BY)]
        return max(names, key=lambda n: self.tagged_version(n) or -1).removeprefix(EMBEDDED_BY) if names else None

    def mark_embedded_by(self, digest: str) -> None:
        """Record that every vector of the latest version was made by the code ``digest`` (the
        index job, once every vector of the run is written): in the version's schema (a new
        version where the record changes), the tags of tables indexed before dropped."""
        if (self.table.schema.metadata or {}).get(_META_EMBEDDED_BY) != digest.encode():
            self.table.to_lance().update_schema_metadata({_META_EMBEDDED_BY.decode(): digest})
            self.table.checkout_latest()
        tags = self.table.tags
        for name in [n for n in tags.list() if n.startswith(EMBEDDED_BY)]:
            tags.delete(name)

    def complete_version(self) -> int | None:
        """The newest version a completed index run finished, or None (none did, or the table
        carries no mark)."""
        return self.tagged_version(COMPLETE_TAG)

    def readable_version(self, job: str, option: str = "--table-version {v}") -> tuple[int, str | None]:
        """The version a reader reads when none is asked for, and the one line to say about it
        (None when it is simply the latest version).

        - the version :data:`COMPLETE_TAG` names; a later one was left by an index run that did
          not finish (interrupted, failed or still running), and the line says so;
        - a table with no mark but other tags: every tag the index job makes names a version a
          completed run finished, so its newest tagged version is read, and the line says so;
        - a table with no tag at all never saw an index run complete (its first one was
          interrupted or failed): refused with :class:`StoreError`, in one line.

        ``option`` is how the reader's user reads version ``{v}`` on purpose (``--table-version {v}``)."""
        t = self.table
        latest = self.version
        tags = {name: int(v["version"]) for name, v in t.tags.list().items()}
        where = f"table {self.name!r}"
        if COMPLETE_TAG in tags:
            read = tags[COMPLETE_TAG]
            if read >= latest:
                return read, None
            return read, (f"{job}: {where}: reading v{read}, the last version a completed index run finished "
                          f"(v{latest} is not marked complete: left by an index run that did not finish, interrupted, failed "
                          f"or still running, or restored from such a version; rerun logicrank index to finish it, or read "
                          f"v{latest} on purpose with {option.format(v=latest)})")
        if tags:
            read = max(tags.values())
            newer = (f"; v{latest} is newer, but no index run tagged it (read it on purpose with {option.format(v=latest)})"
                     if latest > read else "")
            return read, (f"{job}: {where} has no completion mark (indexed before logicrank recorded complete runs): reading "
                          f"v{read}, the newest version an index run tagged{newer}; rerun logicrank index to mark it")
        raise StoreError(
            f"{job}: {where} in {self.uri!r} has no version that an index run completed: its first index run was interrupted "
            f"or failed (or is still running), leaving v{latest} with {t.count_rows():,} documents; rerun logicrank index to finish "
            f"it (documents already written are kept), or read v{latest} on purpose with {option.format(v=latest)}."
        )

    def readable(self, version: int | str | None, job: str, option: str = "--table-version {v}"):
        """This table pinned to the version a reader reads, and the line to say about it:
        ``version`` when given (any version, on purpose: no line), else
        :meth:`readable_version`'s choice."""
        bound = self._metadata_cache_bytes
        if version is not None:
            return type(self)(self.uri, self.name, version=version, metadata_cache_bytes=bound), None
        read, note = self.readable_version(job, option)
        return type(self)(self.uri, self.name, version=read, metadata_cache_bytes=bound), note
