# Two commands do all set-up on a fresh Linux machine (Python >= 3.10, make, g++):
#   make bench   # build, then run the all_reduce microbenchmark (2 emulated machines x 2 ranks)
#   make test    # build, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# ccache makes rebuilds after a one-file change short, where it is installed.
BUILD_CXX := $(shell [ -x /usr/lib/ccache/g++ ] && echo /usr/lib/ccache/g++ || echo c++)

.PHONY: setup build test bench lint clean

setup: build

$(INSTALLED): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# FAIRRING_WITH_CUDA=auto|1|0 (see setup.py); CI sets 1 so a lost CUDA path fails.
build: $(INSTALLED)
	CXX=$(BUILD_CXX) MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py --quiet build_ext --inplace

# pytest's exit code 5 (no test ran) is a failure here.
test: build
	$(PY) -m pytest tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: no test ran" >&2; exit 1; fi; exit $$status

bench: build
	$(PY) -m fairring.bench $(BENCH_ARGS)

lint: $(INSTALLED)
	$(PY) -m ruff check setup.py fairring tests benchmarks
	$(PY) -m ruff format --check setup.py fairring tests benchmarks

clean:
	rm -rf build fairring/*.so $(VENV)
