import pytest

from logicrank.pipelines.config.settings import RayConfig

RAY = RayConfig(num_cpus=2, batch_rows=64)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the session, started by the first test that asks for it (a
    module that runs jobs or Ray itself: ``pytestmark = pytest.mark.usefixtures("ray_cluster")``).
    Jobs join it: ``ray_session`` reuses a cluster already initialised in the process and leaves
    it running; without it, each job would start and stop a cluster of its own."""
    from logicrank.jobs.raysession import ray_session

    with ray_session(RAY) as ray:
        yield ray


@pytest.fixture(scope="module")
def kept_engines(ray_cluster):
    """A module's jobs on the session's cluster, each LLM pool kept for the next job that asks
    for the same engines (``keep_engines``, as an experiment runs its jobs): an engine starts
    once per module and engine settings, not once per job. The pool ends with the module, or
    when a job (or a fixture's job) starts for other engines or none."""
    from logicrank.jobs.raysession import keep_engines

    with keep_engines():
        yield


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory, ray_cluster):
    """The ITLR benchmark's layout, small: 32 queries (one per template), ~150 documents, indexed."""
    from logicrank.jobs.index import run_index
    from logicrank.pipelines.config.settings import IndexConfig
    from logicrank.pipelines.datasets import scifact
    from logicrank.pipelines.generate.synthetic import generate

    root = tmp_path_factory.mktemp("itlr")
    generate(scifact().corpus, root / "syn", per_template=1, seed=3)
    run_index(IndexConfig(corpus=str(root / "syn" / "corpus.jsonl"), db=str(root / "db")), root / "index")
    return root


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama checkpoint (tests/tiny_llm.py), built once per session."""
    from tests.tiny_llm import build_tiny_llm

    return build_tiny_llm(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_cfg(tiny_dir):
    from logicrank.pipelines.config.settings import LLMConfig

    return LLMConfig(model=str(tiny_dir), max_model_len=1024, cache=None, max_num_seqs=64)
