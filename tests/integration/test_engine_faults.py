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

from jobs.llm_service import LLMService
from pipelines.llm import prompts
from tests.faults import kill_processes, processes

pytestmark = pytest.mark.integration


def _kill_core_during_next_call(killed: list[int], delay_s: float = 0.5) -> threading.Thread:
    """Once an engine actor is inside a call (its process title ends in ``.call``), wait
    ``delay_s`` and kill its engine core: the call is then waiting on a dead core."""

    def run():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not processes("_EngineActor.call"):
            time.sleep(0.01)
        time.sleep(delay_s)
        killed.append(kill_processes("VLLM::EngineCore"))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_core_that_dies_under_a_running_call_is_found_and_its_batch_sent_again(tiny_cfg):
    cfg = tiny_cfg.model_copy(update={"cache": None, "engine_process": "separate", "batch_rows": 64})
    template = prompts.load("gen_question")
    values = [{"logical_query": f'"topic {i}" AND NOT "other topic {i}"'} for i in range(64)]
    pool = LLMService(cfg)
    # the reference, from the engine before it is killed (it is then up: the kill below lands in generation, not
    # in its start); the batch sent again after the kill goes to a new engine, so both answers come from a cold
    # prefix cache
    want = [g.text for g in pool.generate(template, values, max_tokens=160)]
    killed: list[int] = []
    killer = _kill_core_during_next_call(killed)
    got = pool.generate(template, values, max_tokens=160)  # one batch of 64 prompts x 160 tokens: seconds of decoding
    killer.join()
    counts = pool.close()
    assert killed == [1]
    assert counts["engine_restarts"] == 1 and counts["actors_lost"] == 0, counts
    # found dead by the pool's health query (the call waits on the dead core), or, when the kill lands
    # mid-request, by the call itself: vLLM's EngineDeadError or the core's socket failing (ZMQError)
    assert counts["last_engine_error"].startswith(("EngineDeadError", "ZMQError")), counts
    assert [g.text for g in got] == want  # every prompt answered once, by the restarted engine, as an uninterrupted pool answers it
