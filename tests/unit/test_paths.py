"""Where logicrank keeps what it derives (pipelines/paths.py): its own variable, then XDG's,
then the home directory; a variable set but empty is unset, never the working directory, and
so is a relative XDG_CACHE_HOME."""

from pathlib import Path

from logicrank.pipelines.paths import cache_root


def test_the_cache_root_reads_its_variables_in_order_and_an_empty_one_as_unset(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "own"
    monkeypatch.setenv("LOGICRANK_CACHE", "")  # as `LOGICRANK_CACHE= logicrank ...` sets it
    assert cache_root() == tmp_path / "xdg" / "logicrank"
    for invalid in ("", "relative/cache"):  # XDG: a relative path is invalid, and ignored
        monkeypatch.setenv("XDG_CACHE_HOME", invalid)
        assert cache_root() == tmp_path / "home" / ".cache" / "logicrank"
    monkeypatch.delenv("LOGICRANK_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path(tmp_path / "home" / ".cache" / "logicrank")
