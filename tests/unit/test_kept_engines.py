"""The LLM pool kept between jobs (jobs/raysession.py ``keep_engines``), without Ray: a fake
cluster id and ``ray.kill`` recorded. The Ray path, a kept engine serving the next job from
its own cache, is tests/integration/test_llm.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from logicrank.jobs import raysession
from logicrank.pipelines.config.settings import LLMConfig


@pytest.fixture
def cluster(monkeypatch):
    """The driver's cluster id (settable) and the actors ``ray.kill`` ended."""
    import ray

    state = SimpleNamespace(id="gcs/node/job-1", killed=[])
    monkeypatch.setattr(raysession, "cluster_id", lambda: state.id)
    monkeypatch.setattr(ray, "kill", lambda actor, **kw: state.killed.append(actor))
    return state


def test_outside_the_block_nothing_is_kept(cluster):
    assert raysession._kept is None
    assert raysession.keep("k", ["a"]) is False and raysession.kept_for("k") == 0 and raysession.take_kept("k") == []


def test_one_pool_is_kept_for_its_engines_on_its_cluster(cluster):
    with raysession.keep_engines():
        assert raysession.keep("k", ["a"]) and raysession.kept_for("k") == 1 and raysession.kept_for("other") == 0
        raysession.end_kept(unless="k")  # a session for the same engines keeps it
        assert raysession.kept_for("k") == 1 and cluster.killed == []
        assert raysession.keep("k2", ["b", "c"])  # a second pool ends the first
        assert cluster.killed == ["a"] and raysession.kept_for("k") == 0 and raysession.kept_for("k2") == 2
        assert raysession.take_kept("k2") == ["b", "c"] and raysession._kept == []  # now the taker's: the block no longer ends it
        raysession.keep("k", ["d"])
        assert raysession.take_kept("other") == [] and cluster.killed == ["a", "d"]  # other engines: the kept pool ends
        raysession.keep("k", ["e"])
        raysession.end_kept()  # a session for no LLM
        assert cluster.killed == ["a", "d", "e"]
        raysession.keep("k", ["f"])
        raysession.drop_kept("other")
        assert raysession.kept_for("k") == 1
        raysession.drop_kept("k")
        assert cluster.killed[-1] == "f" and raysession.kept_for("k") == 0
        raysession.keep("k", ["g"])
    assert cluster.killed[-1] == "g" and raysession._kept is None  # the block's end


def test_a_pool_kept_on_a_cluster_the_driver_left_is_dropped_not_taken(cluster):
    with raysession.keep_engines():
        raysession.keep("k", ["a"])
        cluster.id = "gcs/node/job-2"  # Ray shut down and started again: the actor died with the first
        assert raysession.kept_for("k") == 0 and raysession.take_kept("k") == [] and raysession._kept == []
        assert cluster.killed == []  # (its handle belongs to a session that is gone)


def test_nested_blocks_are_one(cluster):
    with raysession.keep_engines():
        with raysession.keep_engines():
            raysession.keep("k", ["a"])
        assert raysession.kept_for("k") == 1 and cluster.killed == []
    assert cluster.killed == ["a"]


@pytest.fixture
def service(monkeypatch, cluster):
    """An LLMService whose pool is two fake actors, without Ray or a model."""
    from logicrank.jobs import llm_service
    from logicrank.pipelines.llm import models

    monkeypatch.setattr(models, "resolve", lambda model, log=None: SimpleNamespace(path="/models/m", model_id="m@1"))
    monkeypatch.setattr(llm_service.LLMService, "_gpus", lambda self, ray: 0.0)

    def make(actors=()):
        s = llm_service.LLMService(LLMConfig(model="m", actors=2))
        s._actors, s._ready = list(actors), dict.fromkeys(actors, True)
        s._running = bool(actors)
        return s
    return make


def test_a_closed_pool_is_kept_unless_a_call_failed_on_it(service, cluster):
    with raysession.keep_engines():
        closed = service(["a", "b"])
        closed.close()
        assert raysession.kept_for(closed.engine_key) == 2 and cluster.killed == []
        failed = service(["c", "d"])
        failed._failed = True  # a call raised: its batches may still run on the engines
        failed.close()
        assert cluster.killed == ["c", "d"] and raysession.kept_for(closed.engine_key) == 2
        restarting = service(["e", "f"])
        restarting._ready["f"] = False  # its engine died: Ray restarts it
        restarting.close()  # its ready actor replaces the kept pool (a, b); the restarting one ends
        assert cluster.killed == ["c", "d", "a", "b", "f"] and raysession.take_kept(closed.engine_key) == ["e"]


def test_a_call_that_raised_marks_the_pool_failed_for_good(service, monkeypatch):
    from logicrank.jobs import llm_service

    s = service(["a"])
    monkeypatch.setattr(llm_service.LLMService, "_start", lambda self: None)
    outcomes = iter([RuntimeError("the engine broke mid-call"), ["ok"]])

    def dispatch(self, ray, task, template, values, kwargs, label):
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out
    monkeypatch.setattr(llm_service.LLMService, "_dispatch", dispatch)
    with pytest.raises(RuntimeError, match="mid-call"):
        s._map("generate", None, [{"q": "x"}], {}, None)
    assert s._map("generate", None, [{"q": "x"}], {}, None) == ["ok"] and s._failed  # a later call's success does not clear it


def test_a_pool_kept_for_a_job_holds_its_resources_until_released_and_outlives_a_job_that_did_not_take_it(service, cluster):
    with raysession.keep_engines():
        raysession.keep(service().engine_key, ["a", "b"])
        idle = service()
        assert idle.holds()["CPU"] == 2.0  # what the job's other work sees held (retrieve releases it to make room)
        idle.close()  # a job that never asked the LLM: the pool stays kept for the next
        assert raysession.kept_for(idle.engine_key) == 2 and cluster.killed == []
        crowded = service()
        crowded.release()  # its shards need the CPUs
        assert cluster.killed == ["a", "b"] and crowded.holds() == {}


def test_the_engine_key_is_the_checkpoint_and_every_setting_but_the_cache_and_the_drivers_batching():
    from logicrank.jobs.llm_service import LLMService

    def key(model_id="m@1", **update):
        return LLMService.engine_key.fget(SimpleNamespace(model_id=model_id, cfg=LLMConfig(model="m").model_copy(update=update)))

    same = [{"cache": None}, {"batch_rows": 8}, {"shard_queries": 2}, {"wave_shards": 3}, {"max_engine_restarts": 0}]
    other = [{"max_num_seqs": 8}, {"actors": 2}, {"cpus_per_actor": 2.0}, {"cpu_threads": 1}, {"max_model_len": 512}, {"model": "n"},
             {"engine_process": "separate"}, {"dtype": "float32"}, {"seed": 1}, {"labels": (" Yes", " No")}, {"chat": False}]
    for update in same:
        assert key(**update) == key(), update
    for update in other:
        assert key(**update) != key(), update
    assert key(model_id="m@2") != key()  # the directory's files rewritten between two jobs: another model


def test_work_that_fits_only_without_the_llm_pools_cpus_or_gpus_makes_it_give_them_back():
    """A pool (kept, or started by an earlier stage) beside the retrieval work a job starts
    (search shards, a retrieval actor pool): released where the work would otherwise wait for ever."""
    from logicrank.jobs.retrieve import crowded

    total, pool = {"CPU": 8.0, "GPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}
    assert not crowded(pool, total, cpus=7.0) and crowded(pool, total, cpus=8.0)
    assert not crowded(pool, total, cpus=2.0, gpus=1.0) and crowded(pool, total, cpus=2.0, gpus=2.0)  # dense shards of a GPU each
    assert not crowded({}, total, cpus=8.0, gpus=2.0)  # no pool: nothing to give back
