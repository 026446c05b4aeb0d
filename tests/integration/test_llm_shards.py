"""OrLog's truth scoring in shards on real vLLM (the tiny random Llama, CPU), killed half-way
and resumed: the resumed job scores only the shards the killed one had not written, and its
output equals an uninterrupted job's: on the integration session's one Ray node, and on a
cluster of a head and two worker nodes on this machine (the engine on a worker node,
tests/integration/llm_shards_child.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.integration.conftest import RAY

pytestmark = [pytest.mark.cluster, pytest.mark.faults]  # killed half-way; the second on three nodes of its own

SCORE_TOL = 1e-5  # P(True) and posteriors from float32 CPU engines, batches composed differently on resume



def test_orlog_killed_half_way_resumes_only_the_missing_shards_and_equals_an_uninterrupted_run(tmp_path, tiny_cfg, synthetic):
    from logicrank.jobs.retrieve import run_retrieve
    from tests.integration.llm_shards_child import Killed, kill_at_two_shards, orlog_config

    k = 4  # 8 queries x 4 candidates x 2 atoms = 64 prompts, in 4 shards of 2 queries, one shard per wave
    cfg = orlog_config(tmp_path, synthetic, tiny_cfg, RAY)

    whole = run_retrieve(cfg, tmp_path / "whole", progress=False)
    total = json.loads((tmp_path / "whole" / "manifest.json").read_text())["llm"]["prompts_run"]
    assert total == 8 * k * 2

    partial = tmp_path / "resumed" / "stages"
    seen: list[str] = []
    try:
        run_retrieve(cfg, tmp_path / "resumed", echo=kill_at_two_shards(partial, seen))
        raise AssertionError("the job was not killed")
    except Killed as stop:
        assert str(stop) == "orlog: shard 2 of 4 written (2 of 4 done)"
    assert not (tmp_path / "resumed" / "manifest.json").exists()
    waves = [int(m[1]) for line in seen if (m := re.fullmatch(r"orlog: (\d+)/\1 prompts scored", line))]  # each wave's last line
    assert waves == [total // 4, total // 4]  # the killed job sent two shards' prompts, and wrote both

    lines: list[str] = []
    resumed = run_retrieve(cfg, tmp_path / "resumed", echo=lines.append)
    manifest = json.loads((tmp_path / "resumed" / "manifest.json").read_text())
    counts = manifest["pipelines"]["orlog"]["stages"][-1]
    assert manifest["llm"]["prompts_run"] == total // 2  # only the two shards the killed job had not written
    assert (counts["shards"], counts["shards_resumed"], counts["forward_passes"]) == (4, 2, total)
    assert any(line.startswith("orlog: 2 of 4 shards read from checkpoints") for line in lines)
    assert [line for line in lines if " written " in line] == ["orlog: shard 3 of 4 written (3 of 4 done)", "orlog: shard 4 of 4 written (4 of 4 done)"]
    assert not list(partial.glob("*.partial"))  # the stage is cached whole: its shards are gone

    a, b = (pq.read_table(p["orlog"]).to_pandas() for p in (whole, resumed))
    assert len(a) == 8 * k and a[["query_id", "doc_id", "rank"]].equals(b[["query_id", "doc_id", "rank"]])
    np.testing.assert_allclose(b["score"], a["score"], rtol=0, atol=SCORE_TOL)
    pa_, pb = (pq.read_table(d / "predicate_scores" / "orlog.parquet").to_pandas() for d in (tmp_path / "whole", tmp_path / "resumed"))
    assert pa_[["query_id", "doc_id", "atom_id"]].equals(pb[["query_id", "doc_id", "atom_id"]])
    np.testing.assert_allclose(pb["p_true"], pa_["p_true"], rtol=0, atol=SCORE_TOL)
    assert np.std(pa_["p_true"]) > 0.01  # the comparison is not between constants
    print(f"kill/resume: {total} prompts in 4 shards; killed job sent {sum(waves)}, resumed job sent {manifest['llm']['prompts_run']}; "
          f"max |score diff| {np.abs(b['score'] - a['score']).max():.2e}, max |p_true diff| {np.abs(pb['p_true'] - pa_['p_true']).max():.2e}")


def test_orlog_killed_half_way_on_a_cluster_of_three_nodes_resumes_only_the_missing_shards(tmp_path, tiny_dir, synthetic):
    from tests.integration.children import run_child_module

    r = run_child_module("tests.integration.llm_shards_child", tmp_path, [str(tmp_path), str(synthetic), str(tiny_dir)])
    assert r["killed"] == "orlog: shard 2 of 4 written (2 of 4 done)" and not r["manifest_after_kill"]
    whole, resumed = r["manifests"]["whole"], r["manifests"]["resumed"]
    total = whole["llm"]["prompts_run"]
    assert total == 8 * 4 * 2 and resumed["llm"]["prompts_run"] == total // 2  # only the two shards the killed job had not written
    counts = resumed["pipelines"]["orlog"]["stages"][-1]
    assert (counts["shards"], counts["shards_resumed"]) == (4, 2)
    assert any(line.startswith("orlog: 2 of 4 shards read from checkpoints") for line in r["resumed_lines"])
    assert not r["partials_left"]
    assert r["engine_nodes"] and r["head"] not in r["engine_nodes"]  # the engines ran on worker nodes, not the driver's
    a, b = (pq.read_table(tmp_path / d / "runs" / "orlog.parquet").to_pandas() for d in ("whole", "resumed"))
    assert len(a) == 8 * 4 and a[["query_id", "doc_id", "rank"]].equals(b[["query_id", "doc_id", "rank"]])
    np.testing.assert_allclose(b["score"], a["score"], rtol=0, atol=SCORE_TOL)
    pa_, pb = (pq.read_table(tmp_path / d / "predicate_scores" / "orlog.parquet").to_pandas() for d in ("whole", "resumed"))
    assert pa_[["query_id", "doc_id", "atom_id"]].equals(pb[["query_id", "doc_id", "atom_id"]])
    np.testing.assert_allclose(pb["p_true"], pa_["p_true"], rtol=0, atol=SCORE_TOL)
