# One obvious way to run things. `make test` and the main job set up .venv/ themselves.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test lint typecheck unit bench clean

setup:
	@scripts/setup.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -n 2 -q

# The README's test command: lint, strict types on negt2i/, and the whole test suite.
test: lint typecheck unit

bench: setup
	$(BIN)/python benchmarks/bench_judge.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
