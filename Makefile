# Two commands for a newcomer: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := tests/node/node_modules/.installed-stamp

.PHONY: venv protos protos-check test demo bench node-deps clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Node.js clients used by the cross-language tests (grpc-js, @ag-ui/client, TanStack, Playwright).
$(NODE_STAMP): tests/node/package.json
	cd tests/node && npm install --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

node-deps:
	@if command -v npm >/dev/null 2>&1 && [ -f tests/node/package.json ]; then $(MAKE) --no-print-directory $(NODE_STAMP); fi

protos: venv
	$(PY) scripts/gen_protos.py

protos-check: venv
	$(PY) scripts/gen_protos.py --check

test: venv node-deps
	$(PY) -m pytest $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/baton demo $(DEMO_ARGS)

bench: venv
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) tests/node/node_modules .pytest_cache
