# Everything starts from a fresh clone: `make demo` and `make test` each set up
# the venv (pinned by constraints.txt; the editable install generates the gRPC
# stubs, setup.py), then run.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.installed
DATA    ?= rankscope-data

.PHONY: all install stubs native ds-venv test test-unit lint format demo bench sample-runs soak clean

all: install

$(STAMP): pyproject.toml constraints.txt setup.py
	python3 -m venv .venv
	$(PIP) install --quiet --upgrade pip
	# the build's own requirements, pinned, then the package built with them (no isolated build env)
	$(PIP) install --quiet -c constraints.txt setuptools grpcio-tools
	$(PIP) install --quiet --no-build-isolation -c constraints.txt -e '.[all,test]'
	touch $(STAMP)

install: $(STAMP) stubs

# The install generated them; regenerate after an edit of the .proto.
stubs: proto/rankscope_pb2.py
proto/rankscope_pb2.py: proto/rankscope.proto $(STAMP)
	$(PY) -m proto.generate

# Native extensions build once per machine (cached); without a compiler the
# pure-torch fallback is used and the tests still pass, so a failed build warns only.
native: install
	-MAX_JOBS=2 $(PY) -m native.build --quiet

# DeepSpeed 0.19.8 in its own venv (.bench-venv-ds/, CPU wheels), for the tests and benchmarks that
# compare against it; once per machine. Offline it fails, warns only, and those tests skip saying why.
ds-venv: install
	-$(PY) -m benches._deepspeed_venv

# Both tiers (tests/unit, tests/integration) and the house checks in tests/, all but the slow tests.
# The three set-up steps are independent (a compiler, ruff, pip): they run side by side.
test: install
	$(MAKE) --no-print-directory -j3 native lint ds-venv
	$(PY) -m pytest -q -m "not slow" tests

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
