# The README's two commands: `make report` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= report

.PHONY: setup report test test-gpu lint bench clean

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup.sh
	touch $@

setup: $(VENV)/.installed

report: setup
	$(BIN)/rmsnorm report --out $(OUT)

test: setup
	$(BIN)/python -m pytest -n 2 --timeout 900 -q

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
