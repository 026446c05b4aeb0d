"""Probe: can ray.data.llm serve the True/False scoring path on this CPU stack? (not a test)

    python tests/perf/probe_ray_data_llm.py

Builds a ray.data.llm vLLM processor on SmolLM2 with per-row sampling params
(max_tokens=1, logprob_token_ids=[True, False]) and times it on the benchmark's prompts,
or reports the error it fails with. The result decides between ray.data.llm and our own
actor class (then jobs/score.py, now the LLM service in jobs/llm_service.py); docs/llm.md records it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logicrank.pipelines.llm import prompts  # noqa: E402
from logicrank.pipelines.llm.models import resolve  # noqa: E402
from tests.perf.bench_llm import truth_prompts  # noqa: E402


def main() -> None:
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    from transformers import AutoTokenizer

    resolved = resolve("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(resolved.path)
    ids = [tok.encode(" True", add_special_tokens=False)[0], tok.encode(" False", add_special_tokens=False)[0]]
    template = prompts.load("truth")
    table = truth_prompts(128)
    rows = [{"prompt": template.render(context=c, statement=s)} for c, s in zip(table.column("context").to_pylist(), table.column("statement").to_pylist(), strict=True)]
    cpus = len(os.sched_getaffinity(0))
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
    result: dict = {"prompts": len(rows)}
    try:
        config = vLLMEngineProcessorConfig(
            model_source=str(resolved.path),
            engine_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 2048, "logprobs_mode": "raw_logits", "block_size": 32},
            concurrency=1,
            batch_size=64,
            chat_template_stage=False,
            tokenize_stage=False,
            detokenize_stage=False,
            placement_group_config={"bundles": [{"CPU": 1}]},
            log_engine_metrics=False,  # its Ray-Prometheus metrics fail to import on this stack
        )
        processor = build_processor(
            config,
            preprocess=lambda r: {"prompt": r["prompt"], "sampling_params": {"max_tokens": 1, "temperature": 0.0, "logprob_token_ids": ids}},
            postprocess=lambda r: {"logprobs": json.dumps(r.get("logprobs"), default=str)[:200]},
        )
        t = time.perf_counter()
        out = processor(ray.data.from_items(rows)).take_all()
        result.update(ok=True, seconds=time.perf_counter() - t, prompts_per_s=len(rows) / (time.perf_counter() - t), example=out[0])
    except Exception as exc:  # noqa: BLE001 - the probe reports any failure
        result.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:500]}", trace=traceback.format_exc()[-1500:])
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
