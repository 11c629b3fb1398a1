# Two commands for a newcomer: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := tests/node/node_modules/.installed-stamp

.PHONY: ts-client venv lock protos protos-check check test test-unit test-faults test-nemesis test-fuzz test-deploy image lint typecheck demo bench bench-compare node-deps clean

# Exact versions from requirements.lock: the code overrides private internals of nats-py,
# uvicorn and the docker SDK, so an unpinned upgrade can break it silently.
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@# The project was the distribution `baton` before `baton-runs`: drop that install of it first.
	$(PY) -m pip uninstall -q -y --disable-pip-version-check baton 2>/dev/null || true
	$(PY) -m pip install -q --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Re-pin after changing dependencies in pyproject.toml (review the diff of requirements.lock).
lock: venv
	$(VENV)/bin/pip-compile -q --extra dev --strip-extras --no-emit-index-url --no-emit-find-links \
	  --unsafe-package baton-runs -o requirements.lock pyproject.toml

# Node.js clients used by the cross-language tests (grpc-js, @ag-ui/client, TanStack, Playwright).
$(NODE_STAMP): tests/node/package.json
	cd tests/node && npm install --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

node-deps:
	@if command -v npm >/dev/null 2>&1 && [ -f tests/node/package.json ]; then $(MAKE) --no-print-directory $(NODE_STAMP); fi

# The TypeScript client package (clients/typescript): npm packages from its lock, then its
# messages generated from protos/baton/v1 (ts-proto + protoc) and tsc into dist/.
TS_DIR := clients/typescript
TS_DEPS := $(TS_DIR)/node_modules/.installed-stamp
TS_BUILT := $(TS_DIR)/dist/.built-stamp
$(TS_DEPS): $(TS_DIR)/package.json $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $(TS_DEPS)

$(TS_BUILT): $(TS_DEPS) $(TS_DIR)/src/index.ts $(TS_DIR)/scripts/gen.mjs $(TS_DIR)/tsconfig.json $(wildcard protos/baton/v1/*.proto)
	cd $(TS_DIR) && npm run -s build
	touch $(TS_BUILT)

ts-client:
	@if command -v npm >/dev/null 2>&1 && command -v protoc >/dev/null 2>&1; then $(MAKE) --no-print-directory $(TS_BUILT); \
	else echo "ts-client: not built: it needs npm and protoc (apt-get install nodejs npm protobuf-compiler)"; fi

protos: venv
	$(PY) scripts/gen_protos.py

protos-check: venv
	$(PY) scripts/gen_protos.py --check

# ruff and mypy first (seconds): `make test` fails on a lint or type error as on a test.
# Three workers (pytest-xdist): most tests wait on real servers and timers, not the CPU; with
# two, two cores stayed about half idle (1.1 cores busy on average), with three 1.4, and the
# suite took 8.3 instead of 11 minutes. TEST_WORKERS=0 runs in one process. A worker that
# crashes is not restarted: its test fails and the run ends, where a restart could hang xdist.
# asyncio's debug mode (pyproject.toml turns it on for a bare `pytest`) records a stack for
# every callback and task: measured here, tests/gateway/test_approvals.py took 230 s with it
# and 129 s without (47 s and 31 s of CPU). `make test` runs without it; the fault suite
# (`make test-faults`, CI's slow cases) and `ASYNCIO_DEBUG=true make test` keep its checks
# (non-threadsafe loop calls, never-awaited coroutines' origins).
ASYNCIO_DEBUG ?= false
TEST_WORKERS ?= 3
test: venv node-deps ts-client check
	$(PY) -m pytest -n $(TEST_WORKERS) --max-worker-restart=0 --dist loadscope --durations=15 \
	  -o asyncio_debug=$(ASYNCIO_DEBUG) $(PYTEST_ARGS)

# The server-free core (pure logic, no etcd/NATS/Docker/node): seconds.
test-unit: venv
	$(PY) -m pytest -m unit -q $(PYTEST_ARGS)

# Configured in pyproject.toml ([tool.ruff], [tool.mypy]); generated baton/v1 stubs excluded.
lint: venv
	$(VENV)/bin/ruff check .

typecheck: venv
	$(VENV)/bin/mypy

check: lint typecheck

# The whole fault suite (tests/faults), slow cases included: real etcd, NATS,
# coordinator, hosts and gateway processes under faults. Prints the recovery-time table and
# writes bench/results/faults.json. `make test` runs only its fast cases.
# FAULTS=slow runs only the slow cases (CI: the fast ones already ran in `make test`).
FAULTS ?= all
test-faults: venv
	BATON_FAULTS=$(FAULTS) $(PY) -m pytest tests/faults -p no:cacheprovider $(PYTEST_ARGS)

# The nemesis (tests/nemesis): a random schedule of faults drawn from SEED (default: a new
# one, printed) over NEMESIS_MINUTES while runs go on, then the checker over the whole
# history. Writes bench/results/nemesis.json; a failure's history, shrunk schedule and logs
# go to bench/results/nemesis-failures/ (docs/development.md "The nemesis").
SEED ?=
NEMESIS_MINUTES ?= 10
test-nemesis: venv
	BATON_NEMESIS=1 NEMESIS_SEED=$(SEED) NEMESIS_MINUTES=$(NEMESIS_MINUTES) \
	  $(PY) -m pytest tests/nemesis -p no:cacheprovider -p no:randomly -s $(PYTEST_ARGS)

# The fuzz suite (tests/fuzz) alone, with FUZZ_SCALE times the inputs `make test` sends it
# (HTTP API, /ds, gRPC; FUZZ_SEED picks other inputs). Prints the inputs tried per surface
# and writes bench/results/fuzz.json.
FUZZ_SCALE ?= 10
FUZZ_SEED ?= 0
test-fuzz: venv
	BATON_FUZZ_SCALE=$(FUZZ_SCALE) BATON_FUZZ_SEED=$(FUZZ_SEED) BATON_FUZZ_SECONDS=900 BATON_FUZZ_WRITE=1 \
	  $(PY) -m pytest tests/fuzz -n 3 --dist loadscope -p no:cacheprovider $(PYTEST_ARGS)

# The offline image build (scripts/build_image.sh): engine, debootstrap'ed base, wheelhouse,
# then baton:local and baton-sandbox:local, the images compose.yaml runs.
image: venv
	scripts/build_image.sh

# The shipped compose.yaml run for real on a local engine (tests/deploy/test_compose_run.py):
# builds the images, brings the stack up, SIGKILLs a host container mid-run. Needs a Docker
# engine (scripts/docker_setup.sh) and docker-compose; a few minutes, so not in `make test`.
test-deploy: venv
	BATON_TEST_DEPLOY=1 $(PY) -m pytest tests/deploy/test_compose_run.py -p no:cacheprovider -s $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/baton demo $(DEMO_ARGS)

bench: venv
	$(PY) -m bench $(BENCH_ARGS)

# A base revision's benches beside the working tree's, interleaved, in one table
# (bench/_compare.py): `make bench-compare REV=main BENCH_ARGS="gateway log"`.
bench-compare: venv
	@test -n "$(REV)" || { echo "usage: make bench-compare REV=<commit> [BENCH_ARGS=\"bench ...\"] [COMPARE_ARGS=--rounds=3]"; exit 2; }
	$(PY) -m bench._compare $(COMPARE_ARGS) $(REV) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) tests/node/node_modules $(TS_DIR)/node_modules $(TS_DIR)/dist $(TS_DIR)/src/gen .pytest_cache
