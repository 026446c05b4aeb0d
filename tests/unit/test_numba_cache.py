"""numba's cache keyed by the content of a group of files (pipelines/numba_cache.py): the same
files with new modification times, or copied to another path, load what was compiled, and an
edit to any file of the group, a callee's included, compiles again. Each look is a fresh
interpreter that writes no bytecode (numba's dispatcher ``stats``: where it caches, hits and
misses)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from logicrank.pipelines.numba_cache import ContentKeyedCache
with ContentKeyedCache("pkg", __import__("pathlib").Path(sys.argv[1]) / "pkg"):
    from pkg import a
import other
print(json.dumps({"f": a.f(3), "other": other.h(3), "path": a.f.stats.cache_path, "other_path": other.h.stats.cache_path,
                  "hits": sum(a.f.stats.cache_hits.values()), "misses": sum(a.f.stats.cache_misses.values())}))
"""


def _look(src: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")} | {"NUMBA_CACHE_DIR": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(src)], cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _touch(*files: Path) -> None:
    for f in files:
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_a_group_loads_across_new_times_and_paths_and_compiles_again_when_a_callee_changes(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "cache"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "a.py").write_text("import numba\nfrom pkg.b import g\n\n@numba.njit(cache=True)\ndef f(x):\n    return g(x) + 1\n")
    (src / "pkg" / "b.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef g(x):\n    return x * 2\n")
    (src / "other.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef h(x):\n    return x - 1\n")

    first = _look(src, cache)
    assert first["f"] == 7 and first["other"] == 2 and (first["hits"], first["misses"]) == (0, 1)
    assert Path(first["path"]).parent == cache and Path(first["path"]).name.startswith("pkg-")
    assert not Path(first["other_path"]).is_relative_to(Path(first["path"]))  # a file outside the group: numba's own cache

    _touch(*(src / "pkg").glob("*.py"))  # the same files rewritten (a reinstall): new times, same content
    again = _look(src, cache)
    assert again["path"] == first["path"] and (again["hits"], again["misses"]) == (1, 0)

    shutil.copytree(src, tmp_path / "copy")  # another checkout of the same files
    copied = _look(tmp_path / "copy", cache)
    assert copied["path"] == first["path"] and (copied["hits"], copied["misses"]) == (1, 0)

    callee = src / "pkg" / "b.py"
    callee.write_text(callee.read_text().replace("x * 2", "x * 30"))  # only the callee's file changes
    edited = _look(src, cache)
    assert edited["f"] == 91 and edited["path"] != first["path"] and (edited["hits"], edited["misses"]) == (0, 1)
