"""OrLog's truth scoring in shards on real vLLM (the tiny random Llama, CPU), killed half-way
and resumed, on a cluster of a head and two worker nodes on this machine (the engines on the
worker nodes, tests/integration/llm_shards_child.py): the killed job wrote two shards, the
resumed job scores only the two it had not written, and its output equals an uninterrupted
job's."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.faults]  # killed half-way, on three nodes of its own

SCORE_TOL = 1e-5  # P(True) and posteriors from float32 CPU engines, batches composed differently on resume


def test_orlog_killed_half_way_on_a_cluster_of_three_nodes_resumes_only_the_missing_shards(tmp_path, tiny_dir, synthetic):
    from tests.integration.children import run_child_module

    r = run_child_module("tests.integration.llm_shards_child", tmp_path, [str(tmp_path), str(synthetic), str(tiny_dir)])
    assert r["killed"] == "orlog: shard 2 of 4 written (2 of 4 done)" and r["manifest_after_kill"] == "running"
    whole, resumed = r["manifests"]["whole"], r["manifests"]["resumed"]
    total = whole["llm"]["prompts_run"]  # 8 queries x 4 candidates x 2 atoms, in 4 shards of 2 queries, one shard per wave
    assert total == 8 * 4 * 2
    waves = [int(m[1]) for line in r["killed_lines"] if (m := re.fullmatch(r"orlog: (\d+)/\1 prompts scored", line))]  # each wave's last line
    assert waves == [total // 4, total // 4]  # the killed job sent two shards' prompts, and wrote both
    assert resumed["llm"]["prompts_run"] == total // 2  # only the two shards the killed job had not written
    counts = resumed["pipelines"]["orlog"]["stages"][-1]
    assert (counts["shards"], counts["shards_resumed"], counts["forward_passes"]) == (4, 2, total)
    assert any(line.startswith("orlog: 2 of 4 shards read from checkpoints") for line in r["resumed_lines"])
    assert [line for line in r["resumed_lines"] if " written " in line] == ["orlog: shard 3 of 4 written (3 of 4 done)",
                                                                          "orlog: shard 4 of 4 written (4 of 4 done)"]
    assert not r["partials_left"]  # the stage is cached whole: its shards are gone
    assert r["engine_nodes"] and r["head"] not in r["engine_nodes"]  # the engines ran on worker nodes, not the driver's
    a, b = (pq.read_table(tmp_path / d / "runs" / "orlog.parquet").to_pandas() for d in ("whole", "resumed"))
    assert len(a) == 8 * 4 and a[["query_id", "doc_id", "rank"]].equals(b[["query_id", "doc_id", "rank"]])
    np.testing.assert_allclose(b["score"], a["score"], rtol=0, atol=SCORE_TOL)
    pa_, pb = (pq.read_table(tmp_path / d / "predicate_scores" / "orlog.parquet").to_pandas() for d in ("whole", "resumed"))
    assert pa_[["query_id", "doc_id", "atom_id"]].equals(pb[["query_id", "doc_id", "atom_id"]])
    np.testing.assert_allclose(pb["p_true"], pa_["p_true"], rtol=0, atol=SCORE_TOL)
    assert np.std(pa_["p_true"]) > 0.01  # the comparison is not between constants
