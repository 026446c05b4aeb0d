"""The actor-pool fit check shared by index, decompose and score (no cluster needed)."""

import pytest

from logicrank.jobs.raysession import local_driver_node, require_fit
from logicrank.pipelines.config.settings import EmbedConfig, RayConfig
from logicrank.pipelines.engines.placement import IN_DRIVER, EncoderPlacement, encoder_placement


def test_a_pool_that_fits_exactly_passes():
    require_fit("score", 2, 4, 1, {"CPU": 8.0, "GPU": 2.0}, ValueError)  # 8 CPU / 2 GPU: all of it
    require_fit("index", 1, 1.5, 0, {"CPU": 2.0}, ValueError, reserve_cpus=0.5)  # 1.5 + the reader's 0.5


@pytest.mark.parametrize(("args", "reserve"), [(("score", 2, 4.5, 1), 0.0), (("score", 3, 1, 1), 0.0), (("index", 1, 1.6, 0), 0.5)])
def test_a_hair_more_than_the_cluster_is_refused(args, reserve):
    cluster = {"CPU": 8.0, "GPU": 2.0} if args[0] == "score" else {"CPU": 2.0, "GPU": 0.0}  # what fits exactly above
    with pytest.raises(ValueError, match="Lower --actors"):
        require_fit(*args, cluster, ValueError, reserve_cpus=reserve)


@pytest.mark.parametrize(
    ("actors", "cpus", "gpus", "reserve", "needs"),
    [(3, 1, 0, 0, "need 3 CPU / 0 GPU"), (2, 1, 1, 0, "need 2 CPU / 2 GPU"), (2, 1, 0, 0.5, "+ 0.5 CPU for the reader need 2.5 CPU")],
)
def test_a_pool_that_does_not_fit_names_what_it_needs(actors, cpus, gpus, reserve, needs):
    with pytest.raises(KeyError) as exc:
        require_fit("score", actors, cpus, gpus, {"CPU": 2.0, "GPU": 1.0}, KeyError, reserve_cpus=reserve)
    assert needs in str(exc.value) and "the cluster has 2.0 / 1.0" in str(exc.value) and "Lower --actors" in str(exc.value)


def _node(cpu: float, gpu: float = 0.0, alive: bool = True, node_id: str | None = None, **custom) -> dict:
    return {"Alive": alive, "NodeID": node_id, "Resources": {"CPU": cpu, **({"GPU": gpu} if gpu else {}), **custom}}


@pytest.mark.parametrize(
    ("config", "nodes", "placed"),
    [
        # no GPU: one encoder per node, each the smallest node's CPUs less the reader's 0.5
        ({}, [_node(2)], EncoderPlacement(1, 1.5, 0.0, "one per node")),
        ({}, [_node(2), _node(16), _node(8, alive=False)], EncoderPlacement(2, 1.5, 0.0, "one per node")),
        ({}, [_node(1)], EncoderPlacement(1, 0.5, 0.0, "one per node")),
        ({}, [_node(0), _node(4)], EncoderPlacement(1, 3.5, 0.0, "one per node")),  # a head node with no CPU hosts none
        ({"embed_resources": {"embed": 1}}, [_node(8), _node(4, embed=1)], EncoderPlacement(1, 3.5, 0.0, "one per node")),
        # GPUs: one encoder per GPU
        ({}, [_node(8, gpu=2), _node(8, gpu=1)], EncoderPlacement(3, 1.0, 1.0, "one per GPU")),
        ({"embed_num_gpus": 0.5}, [_node(8, gpu=2)], EncoderPlacement(4, 1.0, 0.5, "0.5 GPU each")),
        ({"embed_num_gpus": 0.7}, [_node(8, gpu=2), _node(8, gpu=1)], EncoderPlacement(3, 1.0, 0.7, "0.7 GPU each")),  # per node
        ({"embed_num_gpus": 0}, [_node(8, gpu=2)], EncoderPlacement(1, 7.5, 0.0, "one per node")),  # GPUs left alone
        # given values are kept
        ({"embed_actors": 2}, [_node(4)], EncoderPlacement(2, 1.0, 0.0, "given")),
        ({"embed_actors": 2, "embed_num_cpus": 0.75}, [_node(2)], EncoderPlacement(2, 0.75, 0.0, "given")),
        ({"embed_num_cpus": 1}, [_node(4), _node(4)], EncoderPlacement(2, 1.0, 0.0, "one per node")),
    ],
)
def test_the_encoder_pool_is_sized_to_the_cluster(config, nodes, placed):
    place = encoder_placement(RayConfig(**config), nodes, reserve_cpus=0.5, embed=EmbedConfig())
    assert place == placed
    cluster = {"CPU": sum(n["Resources"]["CPU"] for n in nodes if n["Alive"]),
               "GPU": sum(n["Resources"].get("GPU", 0) for n in nodes if n["Alive"])}
    require_fit("index", place.actors, place.num_cpus, place.num_gpus, cluster, ValueError, reserve_cpus=0.5)  # and fits


def test_the_stderr_filter_drops_only_the_known_native_line(capfd, monkeypatch):
    import os

    from logicrank.jobs.raysession import VERBOSE_ENV, drop_native_noise

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    noise = (b"[2026-11-22 13:14:23,994 E 4800 4800] core_worker.cc:2465: Actor with class name: 'MapWorker(X)' and ID: 'ab' "
             b"has constructor arguments in the object store and max_restarts > 0. See ...\n")
    with drop_native_noise():
        os.write(2, b"kept before\n" + noise + b"kept after, no newline")
    assert capfd.readouterr().err == "kept before\nkept after, no newline"


def test_the_stderr_filter_leaves_a_replaced_fd2_alone(capfd, monkeypatch):
    import os
    import tempfile

    from logicrank.jobs.raysession import VERBOSE_ENV, drop_native_noise

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    with tempfile.TemporaryFile() as other:
        saved = os.dup(2)
        try:
            with drop_native_noise():
                os.write(2, b"through the filter\n")
                os.dup2(other.fileno(), 2)  # someone else (pytest's capture, say) takes fd 2 over
            os.write(2, b"to the new owner\n")  # still theirs: the filter did not put its own back
            other.seek(0)
            assert other.read() == b"to the new owner\n"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    assert "through the filter" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("actors", "engine_gib", "cluster_gib", "expected"),
    [
        (2, 0.01, 16, 2),  # SciFact's engines: the CPUs decide
        (16, 4.0, 64, 12),  # 2.8M vectors per actor: 64 GiB hold 12 actors of 4 + 1 GiB, not 16
        (8, 30.0, 24, 1),  # more than the cluster holds: one actor still runs (as the driver would)
        (4, 1.0, 0, 4),  # memory unknown: no cap
    ],
)
def test_the_retrieval_pool_is_capped_by_memory(actors, engine_gib, cluster_gib, expected):
    from logicrank.pipelines.engines.exact import pool_within_memory

    assert pool_within_memory(actors, int(engine_gib * 2**30), cluster_gib * 2**30) == expected


@pytest.mark.parametrize(
    ("config", "nodes", "how"),
    [
        ({}, [_node(2, node_id="d")], "driver"),  # one CPU node, the driver's own: no pool
        ({}, [_node(2, node_id="d"), _node(2, node_id="w", alive=False)], "driver"),  # a dead node does not count
        ({}, [_node(0, node_id="h"), _node(4, node_id="d")], "driver"),  # a head node without CPUs hosts no encoder
        ({}, [_node(2, node_id="w")], "one per node"),  # a remote cluster's one node: the driver is elsewhere
        ({}, [_node(2, node_id="d"), _node(2, node_id="w")], "one per node"),  # two nodes: one encoder on each
        ({"embed_actors": 1}, [_node(2, node_id="d")], "given"),  # --actors: a pool, as asked
        ({"embed_num_cpus": 1}, [_node(2, node_id="d")], "one per node"),  # CPUs each given: a pool
        ({"embed_resources": {"embed": 1}}, [_node(2, node_id="d", embed=1)], "one per node"),  # nodes chosen by resource
        ({}, [_node(8, gpu=1, node_id="d")], "one per GPU"),  # torch on a GPU: an actor holds it
    ],
)
def test_one_cpu_node_that_is_the_drivers_encodes_in_the_driver(config, nodes, how):
    place = encoder_placement(RayConfig(**config), nodes, reserve_cpus=0.5, embed=EmbedConfig(), driver_node="d")
    assert (place == EncoderPlacement(0, 0.0, 0.0, IN_DRIVER)) == (how == "driver")
    assert place.how.startswith(how) and (place.actors == 0) == (how == "driver")


@pytest.mark.parametrize("embed", [EmbedConfig(device="cpu"), EmbedConfig(backend="openvino")])
def test_an_encoder_asked_to_run_on_the_cpu_takes_no_gpu(embed):
    place = encoder_placement(RayConfig(), [_node(8, gpu=2)], reserve_cpus=0.5, embed=embed)
    assert place == EncoderPlacement(1, 7.5, 0.0, "one per node")


def test_auto_resolves_the_device_from_the_placement_not_from_what_torch_sees():
    from logicrank.pipelines.engines.embed import ModelError, concrete

    assert concrete(EmbedConfig(), gpu=True).device == "cuda" and concrete(EmbedConfig(), gpu=True).backend == "torch"
    assert concrete(EmbedConfig(), gpu=False).device == "cpu"  # an actor with no GPU reserved, a driver
    assert concrete(EmbedConfig(backend="openvino"), gpu=True).device == "cpu"
    assert concrete(EmbedConfig(backend="torch", device="cuda:1")).device == "cuda:1"
    with pytest.raises(ModelError, match="the openvino backend runs on the CPU; device 'cuda' needs backend torch"):
        concrete(EmbedConfig(backend="openvino", device="cuda"))
    again = concrete(EmbedConfig())
    assert concrete(again) == again  # idempotent


def test_auto_picks_openvino_only_for_mean_pooled_models(tmp_path):
    """``concrete`` resolves backend auto from the model's pooling (sentence-transformers'
    modules.json and the pooling config): the mean of the tokens only is OpenVINO's; anything
    else, or a pooling that cannot be read, is torch."""
    import json

    from logicrank.pipelines.engines.embed import concrete

    assert EmbedConfig().model == "all-MiniLM-L6-v2"
    assert concrete(EmbedConfig()).backend == "openvino"  # mean-pooled; openvino is installed with the project
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                                                       {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    assert concrete(EmbedConfig(model=str(tmp_path))).backend == "torch"  # a CLS-pooled local model: torch, not a refusal
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))
    assert concrete(EmbedConfig(model=str(tmp_path))).backend == "openvino"
    (tmp_path / "bare").mkdir()  # no modules.json: the pooling cannot be read
    assert concrete(EmbedConfig(model=str(tmp_path / "bare"))).backend == "torch"
    # a Dense projection after the mean (GTR-T5, sentence-T5): the OpenVINO encoder would skip it
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
               {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert concrete(EmbedConfig(model=str(tmp_path))).backend == "torch"
    (tmp_path / "modules.json").write_text(json.dumps([m for m in modules if m["name"] != "2"]))
    assert concrete(EmbedConfig(model=str(tmp_path))).backend == "openvino"


def test_a_model_with_query_or_document_prompts_is_refused_not_encoded_without_them(tmp_path):
    """E5- and BGE-style models define prompts ("query: ", "passage: ") in
    config_sentence_transformers.json; the encoder reads texts as given, so such a model is
    refused in one line before anything loads. Empty prompts (what sentence-transformers
    saves by default) and no config at all are a model like any other."""
    import json

    from logicrank.pipelines.engines.embed import Embedder, ModelError, refuse_unapplied

    config = tmp_path / "config_sentence_transformers.json"
    refuse_unapplied(str(tmp_path))
    config.write_text(json.dumps({"prompts": {"query": "", "document": ""}, "default_prompt_name": None}))
    refuse_unapplied(str(tmp_path))
    config.write_text(json.dumps({"prompts": {"query": "query: ", "document": "passage: "}}))
    with pytest.raises(ModelError, match=r"defines prompts \{'query': 'query: ', 'document': 'passage: '\}.*does not apply") as info:
        Embedder(EmbedConfig(model=str(tmp_path)))
    assert "\n" not in str(info.value)
    # one route for queries and documents, scored by the cosine: a Router, or another similarity, is refused too
    config.write_text(json.dumps({"prompts": {}, "similarity_fn_name": "cosine"}))
    refuse_unapplied(str(tmp_path))
    config.write_text(json.dumps({"prompts": {}, "similarity_fn_name": "dot"}))
    with pytest.raises(ModelError, match=r"scored by 'dot' similarity"):
        Embedder(EmbedConfig(model=str(tmp_path)))
    config.write_text("{}")
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}]))
    with pytest.raises(ModelError, match=r"routes queries and documents through different modules \(sentence_transformers.models.Router\)"):
        Embedder(EmbedConfig(model=str(tmp_path)))


def test_a_cluster_joined_by_address_never_runs_work_in_the_driver():
    """Shared: its work goes to pools that reserve CPUs (decided before Ray is asked anything)."""
    assert local_driver_node(RayConfig(address="ray://head:10001")) is None
    assert local_driver_node(RayConfig(address="10.0.0.1:6379")) is None


class _FakeRay:
    """Ray's calls RayTasks makes, in one process: each task finishes at once, in the order
    sent; ``fails`` names the arguments whose task raises, ``finished`` those whose task has
    finished when a look (a wait of no timeout) is made. Records what is cancelled."""

    def __init__(self, fails: set, finished: set = frozenset()):
        self.fails, self.finished, self.cancelled, self.results = fails, finished, [], {}

    def remote(self, **_):
        fake = self

        class _Task:
            @staticmethod
            def remote(step, *args):
                ref = object()
                fake.results[ref] = (args, step)
                return ref

        return lambda fn: _Task

    def wait(self, refs, num_returns=1, fetch_local=True, **options):
        if options.get("timeout") == 0:  # a look: those finished now
            done = [r for r in refs if self.results[r][0][0] in self.finished]
            return done, [r for r in refs if r not in done]
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        args, step = self.results[ref]
        if args[0] in self.fails:
            raise ValueError(f"task {args[0]} failed")
        return "node", step(*args)

    def cancel(self, ref, force=False):
        self.cancelled.append(self.results[ref][0][0])


def test_a_failed_task_is_not_cancelled_only_the_tasks_still_running():
    """The task that failed has finished: RayTasks cancels the others it sent that still run,
    never that one nor one finished meanwhile (Ray's force-cancel of a finished task aborted
    the driver once)."""
    from logicrank.jobs.raysession import RayTasks

    fake = _FakeRay(fails={0})
    with pytest.raises(ValueError, match="task 0 failed"):
        RayTasks(fake, at_once=3)(lambda x: x, [(0,), (1,), (2,)])
    assert fake.cancelled == [1, 2]
    fake = _FakeRay(fails={0}, finished={2})  # task 2 finished while task 0's failure was read: left, as task 0
    with pytest.raises(ValueError, match="task 0 failed"):
        RayTasks(fake, at_once=3)(lambda x: x, [(0,), (1,), (2,)])
    assert fake.cancelled == [1]
    assert RayTasks(_FakeRay(fails=set()), at_once=2)(lambda x: x * x, [(i,) for i in range(5)]) == [0, 1, 4, 9, 16]
