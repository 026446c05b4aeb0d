"""The actor-pool fit check shared by index, decompose and score (no cluster needed)."""

import pytest

from jobs.raysession import require_fit


def test_a_pool_that_fits_passes():
    require_fit("score", 2, 4, 1, {"CPU": 8.0, "GPU": 2.0}, ValueError)
    require_fit("index", 1, 1, 0, {"CPU": 2.0}, ValueError, reserve_cpus=0.5)


@pytest.mark.parametrize(
    ("actors", "cpus", "gpus", "reserve", "needs"),
    [(3, 1, 0, 0, "need 3 CPU / 0 GPU"), (2, 1, 1, 0, "need 2 CPU / 2 GPU"), (2, 1, 0, 0.5, "+ 0.5 CPU for the reader need 2.5 CPU")],
)
def test_a_pool_that_does_not_fit_names_what_it_needs(actors, cpus, gpus, reserve, needs):
    with pytest.raises(KeyError) as exc:
        require_fit("score", actors, cpus, gpus, {"CPU": 2.0, "GPU": 1.0}, KeyError, reserve_cpus=reserve)
    assert needs in str(exc.value) and "the cluster has 2.0 / 1.0" in str(exc.value) and "Lower --actors" in str(exc.value)
