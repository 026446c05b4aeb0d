"""`lr.index` from Python: the index job in a script that lacks an ``if __name__ == "__main__":``
guard, on real Ray, LanceDB and the packaged MiniLM model. Before: there was no public
function, and the internal one saved the BM25 index in a process made by multiprocessing's
spawn, which imports the caller's script again and so ran the whole script a second time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import logicrank as lr
from logicrank.pipelines.engines.store import DocStore
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.cluster]  # lr.index runs the index job

_SCRIPT = """
import json, sys
print("script body ran", flush=True)
import logicrank as lr
s = lr.index(sys.argv[1], sys.argv[2], out=sys.argv[3], ray=lr.RayConfig(num_cpus=2, batch_rows=64))
print("summary " + json.dumps({"inserted": s.inserted, "version": s.table_version, "tag": s.tag, "bm25": s.maintenance["bm25_index"]}))
"""


def test_lr_index_runs_in_a_script_without_a_main_guard(tmp_path, docs300):
    corpus = write_jsonl(tmp_path / "c.jsonl", docs300[:40])
    script = tmp_path / "index_it.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run([sys.executable, str(script), str(corpus), str(tmp_path / "db"), str(tmp_path / "run")], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines.count("script body ran") == 1, done.stdout  # the script ran once: no child process imported it again
    summary = json.loads(next(x for x in lines if x.startswith("summary ")).removeprefix("summary "))
    store = DocStore(str(tmp_path / "db"))
    assert (summary["inserted"], summary["version"], store.count()) == (40, store.version, 40)
    assert summary["tag"] in store.table.tags.list() and store.complete_version() == store.version
    assert summary["bm25"]["how"] == "built" and summary["bm25"]["docs"] == 40  # saved by the child process
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["status"] == "ok"


def test_lr_index_refuses_a_bad_option_in_one_line(tmp_path):
    with pytest.raises(lr.UserError) as refused:
        lr.index(tmp_path / "c.jsonl", tmp_path / "db", max_delete_fraction=2)
    assert str(refused.value).startswith("index: max_delete_fraction 2") and "\n" not in str(refused.value)
    assert not (tmp_path / "db").exists()
