# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates .venv on first use and installs the pinned dependencies (constraints.txt).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo dev test lint format lock clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuprov demo

dev: $(STAMP)
	$(BIN)/gpuprov dev

test: $(STAMP)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# Regenerate the pins after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/gpuprov-lock && $(PYTHON) -m venv /tmp/gpuprov-lock
	/tmp/gpuprov-lock/bin/pip install --quiet '.[dev]'
	/tmp/gpuprov-lock/bin/pip freeze --exclude gpuprov > constraints.txt

clean:
	rm -rf $(VENV) .data
