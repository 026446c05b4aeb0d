import pytest

from schemas.config import RayConfig

RAY = RayConfig(num_cpus=2, batch_rows=64)


@pytest.fixture(scope="session", autouse=True)
def ray_cluster():
    """One local Ray cluster for every integration test (jobs join it)."""
    from jobs.raysession import ray_session

    with ray_session(RAY) as ray:
        yield ray
