"""The table's versions: the current one, when each was made, tags, restoring an old version,
dropping old tags so their versions can be pruned."""

from __future__ import annotations

import re

from pipelines.store.base import StoreError


class Versions:
    """The versions side of :class:`pipelines.store.DocStore`."""

    @property
    def version(self) -> int:
        return int(self.table.version)

    def version_stamps(self) -> dict[int, str]:
        """Version -> when it was made, for every version kept (a table dropped and made again
        reuses version numbers, not times)."""
        return {int(v["version"]): str(v["timestamp"]) for v in self.table.list_versions()}

    def version_stamp(self) -> str:
        return self.version_stamps().get(self.version, "")

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
        """Make ``version`` (a number or a tag) the latest version again; returns the new version."""
        t = self.table
        versions = [v["version"] for v in t.list_versions()]
        tags = t.tags.list()
        if version not in versions and version not in tags:
            raise StoreError(
                f"store: table {self.name!r} has no version {version!r}; versions kept: {versions[-10:]}, tags: {sorted(tags)[-10:]}."
            )
        t.restore(version)
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
