"""The LLM pool when an engine core dies under a running call (real Ray, real vLLM on a tiny
random Llama; the engine core in its own process, as vLLM runs it on GPUs).

vLLM's synchronous client never wakes a call that waits on a dead core: without the pool's
health query that call, and the job, would wait forever. The whole-job cases (generation and
truth scoring, the actor killed, an engine that keeps dying, a stall) are in test_generate.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from logicrank.jobs import llm_service
from logicrank.jobs.llm_service import LLMService
from logicrank.jobs.watchdog import working
from logicrank.pipelines.llm import prompts
from tests.faults import descendants, engine_cores

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.usefixtures("ray_cluster")]  # jobs join the session's cluster (conftest.py)


def _wait_for(what: str, event) -> None:
    """Poll ``event()`` until it is true (``what`` names it). No deadline: one that never comes
    holds the test until pytest's timeout (tests/integration/children.py), whose stacks show this wait."""
    while not event():
        time.sleep(0.01)


def test_a_core_that_dies_under_a_running_call_is_found_and_its_batch_sent_again(tiny_cfg, monkeypatch):
    """The engine core is paused (SIGSTOP) before the call, so the call cannot finish however
    fast the machine is; once the engine holds all of the call's prompts (an event the actor
    reports), the core is killed under it. The pool finds the dead core, restarts the engine
    and sends the batch again. Meanwhile the pool looks at its engine's CPU time for the stall
    watchdog: the engine starting is at work (and the watchdog hears so), the paused core is not."""
    import ray

    cfg = tiny_cfg.model_copy(update={"cache": None, "engine_process": "separate", "batch_rows": 64})
    template = prompts.load("gen_question")
    values = [{"logical_query": f'"topic {i}" AND NOT "other topic {i}"'} for i in range(64)]
    looks: list[bool] = []  # each of the pool's comparisons of two CPU readings of its engine: at work?

    def look(*args, **kwargs) -> bool:
        looks.append(working(*args, **kwargs))
        return looks[-1]

    monkeypatch.setattr(llm_service, "working", look)
    beats: list[str] = []
    monkeypatch.setattr(llm_service, "beat", lambda what=None: beats.append(what))
    pool = LLMService(cfg, poll_s=0.5)  # (a look at the engines every half second the call waits, not every 5)
    # the reference, from the engine before it is killed (it is then up: the kill below lands in generation, not
    # in its start); the batch sent again after the kill goes to a new engine, so both answers come from a cold
    # prefix cache
    want = [g.text for g in pool.generate(template, values, max_tokens=160)]
    assert any(looks), f"the engine's start was never seen at work: {looks}"
    assert any("1 engine(s) at work, 0/64 prompts answered" in b for b in beats), beats
    cores = engine_cores()
    assert len(cores) == 1, descendants()
    cores[0].suspend()  # it takes the next call's requests but answers none of them
    actor = pool._actors[0]
    got: dict = {}
    call = threading.Thread(target=lambda: got.update(texts=[g.text for g in pool.generate(template, values, max_tokens=160)]))
    call.start()
    _wait_for("the engine to hold the call's 64 prompts",
              lambda: ray.get(actor.requests_in_flight.options(concurrency_group="health").remote()) == len(values))
    # the next two comparisons may hold a reading from before: the actor's own work handing the prompts to its core
    paused = len(looks) + 2
    _wait_for("three looks at the paused engine", lambda: len(looks) >= paused + 3)
    assert not any(looks[paused:]), f"a paused engine core was taken for an engine at work: {looks[paused:]}"
    cores[0].kill()
    call.join()
    counts = pool.close()
    assert counts["engine_restarts"] == 1 and counts["actors_lost"] == 0, counts
    # found dead by the pool's health query (the call waits on the dead core), or by the call itself:
    # vLLM's EngineDeadError or the core's socket failing (ZMQError)
    assert counts["last_engine_error"].startswith(("EngineDeadError", "ZMQError")), counts
    assert got["texts"] == want  # every prompt answered once, by the restarted engine, as an uninterrupted pool answers it
