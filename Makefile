# Everything starts from a fresh clone: `make demo` and `make test` each set up
# the venv (pinned by constraints.txt; the editable install generates the gRPC
# stubs, setup.py), then run.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.installed
DATA    ?= rankscope-data

.PHONY: all install stubs native ds-venv test test-unit lint docs format demo bench sample-runs soak clean

all: install

# pip's own output goes to $(INSTALL_LOG); the console gets a line per step, and the log's tail and
# its name when a step fails.
INSTALL_LOG := .venv/install.log
QUIETLY = >>$(INSTALL_LOG) 2>&1 || { tail -n 30 $(INSTALL_LOG); echo "make: the install failed; pip's output is in $(INSTALL_LOG)"; exit 1; }

$(STAMP): pyproject.toml constraints.txt setup.py
	@echo "make: setting up .venv (pinned by constraints.txt; pip's output in $(INSTALL_LOG)) ..."
	@python3 -m venv .venv && : > $(INSTALL_LOG)
	@$(PIP) install --upgrade pip $(QUIETLY)
	@# the build's own requirements, pinned, then the package built with them (no isolated build env)
	@$(PIP) install -c constraints.txt setuptools grpcio-tools $(QUIETLY)
	@$(PIP) install --no-build-isolation -c constraints.txt -e '.[all,test]' $(QUIETLY)
	@touch $(STAMP)
	@echo "make: .venv ready"

install: $(STAMP) stubs

# The install generated them; regenerate after an edit of the .proto.
stubs: proto/rankscope_pb2.py
proto/rankscope_pb2.py: proto/rankscope.proto $(STAMP)
	$(PY) -m proto.generate

# Native extensions build once per machine (cached); without a compiler the
# pure-torch fallback is used and the tests still pass, so a failed build warns only.
native: install
	-MAX_JOBS=2 $(PY) -m native.build --quiet

# DeepSpeed 0.19.8 in its own venv (.bench-venv-ds/, CPU wheels) with its JIT ops built, for the tests
# and benchmarks that compare against it; once per machine. Offline it fails, warns only, and those
# tests skip saying why.
ds-venv: install
	-$(PY) -m benches._deepspeed_venv

# Both tiers (tests/unit, tests/integration) and the house checks in tests/, all but the slow tests.
# The set-up steps are independent (a compiler, ruff, pip, mkdocs): they run side by side. Then two
# phases: every test that does not measure time runs on TEST_WORKERS pytest-xdist workers (a test file
# stays on one worker, so its module fixtures are made once); then the `timing` tests (step times,
# detection delays, CPU contention) one at a time, with nothing of ours beside them. Both phases always
# run; the target fails if either did. tests/_durations.py fails a test over 60 s and lists the slowest.
TEST_WORKERS ?= 3
test: install
	$(MAKE) --no-print-directory -j4 native lint ds-venv docs
	@status=0; \
	echo "make test: phase 1 of 2, the tests that measure no time, on $(TEST_WORKERS) workers"; \
	$(PY) -m pytest -q -m "not slow and not timing" -n $(TEST_WORKERS) --dist loadfile tests || status=$$?; \
	echo "make test: phase 2 of 2, the timing tests, one at a time"; \
	$(PY) -m pytest -q -m "timing and not slow" tests || status=$$?; \
	exit $$status

# The unit tier alone (pure functions: no process, socket, browser or process group; tests/unit/conftest.py
# fails a test that tries), a minute or so between edits. native: a JIT build would start a compiler.
test-unit: install native
	$(PY) -m pytest -q -m "not slow" tests/unit

# The timing-sensitive tests (marker `timing`) again beside two busy-loop processes, which it always stops.
.PHONY: test-stress
test-stress: install native
	$(PY) -m tests.stress

# ruff lint + format check (pyproject.toml [tool.ruff]); `make format` rewrites.
lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# The docs site (mkdocs.yml): --strict fails on a broken link or anchor, a page left out of the nav,
# and the generated CLI and config-key references (docs/hooks/reference.py) are built from the code.
docs: install
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir build/site

format: install
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

demo: install
	.venv/bin/rankscope demo --data-dir $(DATA)

bench: install
	$(PY) -m benches.run

sample-runs: install
	$(PY) -m collector.tools.sample_runs --out sample_runs

soak: install
	$(PY) -m pytest -q -m slow tests

clean:
	rm -rf .venv build *.egg-info proto/rankscope_pb2*
