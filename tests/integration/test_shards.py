"""Sharded search (bm25, dense, ITLR exact) across a cluster of several nodes on this machine
equals the search in one process; a node killed mid-search changes nothing in the run; the BM25
index built in segments across the nodes equals a build in one process, a node killed mid-build
too.

The tests read one run of tests/integration/shards_child.py, a child process with its own Ray
cluster (a head node and three worker nodes, ``ray.cluster_utils.Cluster``): `retrieve`'s job
runs bm25, dense and ITLR exact over a table of 900 SciFact documents in 3 shards (one search
actor per worker node, each mapping one range of the index), in 1 (the whole index, in the
driver), and in 3 shards again with a worker node killed mid-search (last). The runs
must agree, query by query: the same documents at the same ranks, scores within
tests/compare.py's tolerance (the weights are the whole collection's, but a shard's float32 sums
may be vectorised in another order than the whole index's: a few last bits move), and two
documents swapped only where their scores are tied within it."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.compare import assert_ranking_close
from tests.integration.children import run_child_module

pytestmark = [pytest.mark.integration, pytest.mark.cluster]  # a cluster of three nodes of its own


@pytest.fixture(scope="module")
def child(tmp_path_factory) -> dict:
    """The child's result: one cluster, one table, three runs (the killed one last)."""
    work = tmp_path_factory.mktemp("shards")
    return run_child_module("tests.integration.shards_child", work, [str(work)])


def _same_runs(r: dict, sharded_run: str) -> None:
    for rid in ("bm25", "dense", "itlr"):
        sharded = pq.read_table(r["runs"][sharded_run]["paths"][rid]).to_pandas()
        whole = pq.read_table(r["runs"]["1"]["paths"][rid]).to_pandas()
        assert len(sharded) == len(whole) and len(whole) >= (100 * 50 if rid == "bm25" else 120 * 50), (rid, len(sharded), len(whole))
        assert sorted(set(sharded["query_id"])) == sorted(set(whole["query_id"])), rid
        for qid, want in whole.groupby("query_id"):
            want, got = want.sort_values("rank"), sharded[sharded["query_id"] == qid].sort_values("rank")
            assert got["rank"].tolist() == want["rank"].tolist(), (rid, qid)
            assert_ranking_close(got["doc_id"].tolist(), want["doc_id"].tolist(), got["score"].tolist(), want["score"].tolist(), f"{rid} {qid}")


def _stage_counts(manifest: dict, run_id: str) -> dict:
    """The counts of a one-stage pipeline's stage, from a retrieve manifest."""
    return manifest["pipelines"][run_id]["stages"][0]


def test_bm25_built_in_segments_across_three_nodes_equals_a_one_process_build(child):
    """The index the runs below search was built by tasks on the worker nodes (SEGMENT_ROWS 300:
    three segments), and its files hold the arrays of a build in one scan, bit for bit."""
    built = child["bm25_build"]
    assert built["done"]["how"] == "built" and built["done"]["segments"] == 3 and built["done"]["docs"] == 900, built
    assert built["nodes"] >= 2, built  # spread (SPREAD: one segment per node where they fit)
    assert built["differ"] == [], built


def test_a_node_killed_mid_bm25_build_leaves_nothing_saved_and_the_build_completes(child):
    """A worker node killed while it weighs a segment (SIGKILL to its raylet): no index is
    saved before the last step renames it into place whole; Ray runs the task again on a node
    left, and the build saves the arrays of a build in one scan."""
    k = child["bm25_killed_build"]
    assert "error" not in k, k.get("error")
    assert k["node"] and k["saved_before"] is False, k
    assert k["done"]["how"] == "built" and k["done"]["segments"] == 3 and k["done"]["docs"] == 900, k
    assert k["held_weighed_on"] and k["node"] not in k["held_weighed_on"], k  # the killed node's task never returned: its rerun did, elsewhere
    assert k["differ"] == [], k


def test_sharded_search_across_three_nodes_equals_one_process(child):
    r = child
    _same_runs(r, "3")
    assert {_stage_counts(r["runs"]["1"]["manifest"], rid)["placement"] for rid in ("bm25", "dense")} == {"driver"}
    assert r["runs"]["3"]["itlr_shards_scored"] and not r["runs"]["1"]["itlr_shards_scored"]
    for stage in ("bm25", "dense"):
        counts = _stage_counts(r["runs"]["3"]["manifest"], stage)
        assert counts["placement"] == "3 shards", counts
        shards = counts["shards"]
        assert len({s["node"] for s in shards}) == 3, shards  # one actor per worker node
        assert shards[0]["rows"][0] == 0 and shards[-1]["rows"][1] == 900 and all(s["rows"][1] > s["rows"][0] for s in shards)
        assert all(s["peak_rss_mib"] > 0 and s["pss_mib"] > 0 for s in shards)
    # bm25's index was saved in segments of 300 documents (shards_child): one whole segment per shard
    assert [s["rows"] for s in _stage_counts(r["runs"]["3"]["manifest"], "bm25")["shards"]] == [[0, 300], [300, 600], [600, 900]]


@pytest.mark.faults
def test_a_node_killed_mid_search_leaves_the_run_identical(child):
    r = child
    assert "kill_error" not in r, r.get("kill_error")
    killed = r["killed"]["node"]
    assert killed, "no node was killed"
    assert 1 <= r["killed"]["batches_before"] < 120 // 20, r["killed"]  # mid-search: batches were left after the kill
    # the bm25 stage was searching when the node died, one shard on it: that shard was placed again on a surviving node
    assert killed in r["killed"]["shard_nodes_before"] and len(r["killed"]["shard_nodes_before"]) == 3, r["killed"]
    nodes = [s["node"] for s in _stage_counts(r["runs"]["3-killed"]["manifest"], "bm25")["shards"]]
    assert len(nodes) == 3 and not any(n.endswith(killed[:8]) for n in nodes) and len(set(nodes)) == 2, (killed, nodes)
    _same_runs(r, "3-killed")
