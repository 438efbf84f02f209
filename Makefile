# Everything starts from a fresh clone: `make demo` and `make test` each set up
# the venv (pinned by constraints.txt), generate the gRPC stubs, then run.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.installed
DATA    ?= rankscope-data

.PHONY: all install stubs native test demo bench sample-runs soak clean

all: install

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv .venv
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP) stubs

stubs: $(STAMP)
	$(PY) -c "from proto.generate import generate; generate()"

# Native extensions build once per machine (cached); without a compiler the
# pure-torch fallback is used and the tests still pass, so a failed build warns only.
native: install
	-MAX_JOBS=2 $(PY) -m native.build --quiet

test: install native
	$(PY) -m pytest -q -m "not slow" tests

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
