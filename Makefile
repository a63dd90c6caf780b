# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates .venv on first use and installs the pinned dependencies (constraints.txt).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-ssh dev test check bench chaos lint format histories lock clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuprov demo

dev: $(STAMP)
	$(BIN)/gpuprov dev

# The SSH tests start OpenSSH's sshd on loopback (tests/sshd.py). Installed only where missing:
# a file target, so this is a no-op wherever sshd is already there.
SSHD := /usr/sbin/sshd
$(SSHD):
	$$([ "$$(id -u)" = 0 ] || echo sudo) sh -c 'export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y openssh-server || { apt-get update && apt-get install -y openssh-server; }'

# The TLS tests put nginx in front of the Temporal dev server (tests/tls.py), as the TLS
# terminator that checks client certificates and API keys. Installed only where missing.
NGINX := /usr/sbin/nginx
$(NGINX):
	$$([ "$$(id -u)" = 0 ] || echo sudo) sh -c 'export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y nginx || { apt-get update && apt-get install -y nginx; }'

# The user data tests read every cloud's generated user data with cloud-init itself (its
# `cloud-init schema` validator and its Python package, tests/cloudinit.py). Installed only
# where missing.
CLOUD_INIT := /usr/bin/cloud-init
$(CLOUD_INIT):
	$$([ "$$(id -u)" = 0 ] || echo sudo) sh -c 'export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y cloud-init || { apt-get update && apt-get install -y cloud-init; }'

# The dashboard tests drive Debian's headless Chromium through its chromedriver (tests/browser.py),
# with Selenium from the pinned Python dependencies. Installed only where missing.
CHROMEDRIVER := /usr/bin/chromedriver
$(CHROMEDRIVER):
	$$([ "$$(id -u)" = 0 ] || echo sudo) sh -c 'export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y chromium chromium-driver || \
		{ apt-get update && apt-get install -y chromium chromium-driver; }'

# Two test processes (pytest-xdist), one per core: the suite waits on servers and subprocesses
# as much as it computes. Each process has its own Temporal dev server and PostgreSQL.
test: $(STAMP) $(SSHD) $(NGINX) $(CLOUD_INIT) $(CHROMEDRIVER)
	$(BIN)/pytest -q -n 2

# The fast lane, for the edit-test loop: lint, then every test not marked `slow` (the modules
# with a test of 2 s or more, or 10 s in all, measured: docs/testing.md). Under two minutes on
# two cores; `make test` stays the whole suite, and what CI runs.
check: $(STAMP) $(SSHD) $(NGINX) $(CLOUD_INIT) $(CHROMEDRIVER)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/pytest -q -n 2 -m "not slow"

# A job bootstrapped over real SSH on this machine: a throwaway OpenSSH sshd on loopback
# (gpuprov/cli/local_sshd.py), the node agent started through it. Needs root, like the SSH tests.
demo-ssh: $(STAMP) $(SSHD)
	$(BIN)/gpuprov demo-ssh

# The performance benchmark (bench/, docs/performance.md); `make bench QUICK=1` takes about three minutes.
bench: $(STAMP)
	$(BIN)/python -m bench $(if $(QUICK),--quick)

# The chaos harness (chaos/, docs/reliability.md): N jobs under injected faults, worker SIGKILLs
# and dev server restarts, then one reconcile pass; exits non-zero if any promise was broken.
# `make chaos N=200 [SEED=1] [KILLS=10] [RESTARTS=2] [WORKERS=2] [DATABASE=postgresql]
# [OUT=summary.md] [KEEP=1]`.
chaos: $(STAMP)
	$(BIN)/python -m chaos --jobs $(or $(N),20) --seed $(or $(SEED),1) \
		$(if $(KILLS),--kills $(KILLS)) $(if $(RESTARTS),--server-restarts $(RESTARTS)) \
		$(if $(WORKERS),--workers $(WORKERS)) $(if $(DATABASE),--database $(DATABASE)) \
		$(if $(OUT),--out $(OUT)) $(if $(KEEP),--keep)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# Rerecord the replay suite's histories (tests/histories/*.json; all, or `make histories
# ONLY="happy_path multi_node"`). Only for a new scenario or a change behind workflow.patched:
# see docs/architecture.md, "Changing workflow code safely".
histories: $(STAMP)
	$(BIN)/python -m tests.histories.record $(ONLY)

# Regenerate the pins after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/gpuprov-lock && $(PYTHON) -m venv /tmp/gpuprov-lock
	/tmp/gpuprov-lock/bin/pip install --quiet '.[dev]'
	/tmp/gpuprov-lock/bin/pip freeze --exclude gpuprov > constraints.txt

clean:
	rm -rf $(VENV) .data
