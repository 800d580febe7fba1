# The README's two commands: `make report` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= report

.PHONY: setup report test test-gpu lint bench clean

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup.sh
	touch $@

# warmup: compile the CPU kernels once here (0.8 s when cached; again after an edit of
# kernels.py) rather than in each test worker or on a report's first CPU op
setup: $(VENV)/.installed
	$(BIN)/python -m rmsnorm warmup

report: setup
	$(BIN)/rmsnorm report --out $(OUT)

test: setup
	$(BIN)/python -m pytest -n 2 --timeout 900 -q

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
