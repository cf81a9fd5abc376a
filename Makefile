# Two commands do all set-up on a fresh Linux machine (Python >= 3.10, make, g++):
#   make bench   # build, then run the all_reduce microbenchmark (2 emulated machines x 2 ranks)
#   make test    # build, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# ccache makes rebuilds after a one-file change short, where it is installed.
BUILD_CXX := $(shell [ -x /usr/lib/ccache/g++ ] && echo /usr/lib/ccache/g++ || echo c++)

.PHONY: setup build test test-oldest bench lint clean wheel wheel-check

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

# The oldest supported torch (requirements-oldest.txt): its own venv, the
# extension built out of tree (build/oldest), and the tests that do not
# depend on timing or namespaces run against it.
OLDEST_VENV := .venv-oldest
OLDEST_TESTS ?= tests/test_build.py tests/test_engine.py tests/test_collectives.py \
	tests/test_rails_protocol.py tests/test_registration.py tests/test_cuda.py \
	tests/test_drop_in.py tests/test_tracing.py
$(OLDEST_VENV)/.installed: requirements-oldest.txt
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet -r requirements-oldest.txt
	touch $@

test-oldest: $(OLDEST_VENV)/.installed
	rm -rf build/oldest && mkdir -p build/oldest/fairring
	cp -r fairring/*.py fairring/bench build/oldest/fairring/
	CXX=$(BUILD_CXX) MAX_JOBS=$${MAX_JOBS:-2} $(OLDEST_VENV)/bin/python setup.py --quiet build_ext \
		--build-lib build/oldest --build-temp build/oldest-temp
	$(OLDEST_VENV)/bin/pytest -p no:cacheprovider -o pythonpath=build/oldest $(OLDEST_TESTS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test-oldest: no test ran" >&2; exit 1; fi; exit $$status

bench: build
	$(PY) -m fairring.bench $(BENCH_ARGS)

# The long soak, outside CI (tests/test_soak.py is the short one): random collectives, each
# checked, for SOAK_ARGS (default 10 minutes), then threads, descriptors and RSS against the warm-up.
SOAK_ARGS ?= --minutes 10
.PHONY: soak
soak: build
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

lint: $(INSTALLED)
	$(PY) -m ruff check setup.py fairring tests benchmarks
	$(PY) -m ruff format --check setup.py fairring tests benchmarks

clean:
	rm -rf build dist fairring/*.so $(VENV) $(OLDEST_VENV)

# Packaging as a user installs it: a wheel built by pip without build isolation
# (against .venv's torch), installed into a fresh virtual environment that has
# the same torch and nothing else of the checkout (a .pth file adds .venv's
# site-packages), then a 2-rank all-reduce from it, run outside the checkout.
WHEEL_VENV := build/wheel-venv
wheel: $(INSTALLED)
	rm -rf dist
	CXX=$(BUILD_CXX) MAX_JOBS=$${MAX_JOBS:-2} $(PY) -m pip wheel --quiet --no-build-isolation --no-deps -w dist .

wheel-check: wheel
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
		"$$($(WHEEL_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-of-dot-venv.pth"
	$(WHEEL_VENV)/bin/python -m pip install --quiet --no-deps dist/fairring-*.whl
	cd "$$(mktemp -d)" && $(abspath $(WHEEL_VENV))/bin/python $(abspath tests/wheel_smoke.py)

# The GPU check: on a machine with a GPU and torch but no network (no venv, no pip), builds
# fairring against $(PYTHON)'s torch, runs tests/test_cuda.py and a CUDA bench (2 processes on
# one GPU as 2 machines), and writes one report: FAIRRING_GPU_REPORT (default gpu-check-report.md).
# GPU_CHECK_ARGS go to `python -m fairring.bench.gpu_check` (see its --help), e.g. --quick or
# "--device cpu" (with FAIRRING_WITH_CUDA=auto, where there is no CUDA). A failed build writes
# the report too. Whole check: GPU_CHECK_SECONDS (the build's time counts).
GPU_REPORT ?= gpu-check-report.md
GPU_CHECK_SECONDS ?= 560
GPU_BUILD_SECONDS ?= 240
.PHONY: gpu-check
gpu-check:
	@report="$${FAIRRING_GPU_REPORT:-$(GPU_REPORT)}"; mkdir -p "$$(dirname "$$report")"; rm -f "$$report"; \
	log="$$(mktemp)"; start=$$(date +%s); \
	if [ -z "$${CUDA_HOME:-}" ] && command -v nvcc >/dev/null 2>&1; then \
	  root="$$(dirname "$$(dirname "$$(readlink -f "$$(command -v nvcc)")")")"; \
	  if [ -f "$$root/include/cuda_runtime_api.h" ]; then export CUDA_HOME="$$root"; fi; \
	fi; \
	export CXX="$(BUILD_CXX)" FAIRRING_WITH_CUDA="$${FAIRRING_WITH_CUDA:-1}" MAX_JOBS="$${MAX_JOBS:-$$(nproc)}"; \
	build="CXX=$$CXX FAIRRING_WITH_CUDA=$$FAIRRING_WITH_CUDA MAX_JOBS=$$MAX_JOBS CUDA_HOME=$${CUDA_HOME:-} $(PYTHON) setup.py --quiet build_ext --inplace"; \
	echo "gpu-check: $$build"; \
	if ! timeout $(GPU_BUILD_SECONDS) $(PYTHON) setup.py --quiet build_ext --inplace >"$$log" 2>&1; then \
	  { echo "# fairring GPU check: FAILED (build)"; echo; echo "The build failed or ran past $(GPU_BUILD_SECONDS) s:"; \
	    echo; echo '```sh'; echo "$$build"; echo '```'; echo; echo '```text'; tail -n 200 "$$log"; echo '```'; } >"$$report"; \
	  tail -n 60 "$$log" >&2; rm -f "$$log"; echo "gpu-check: FAILED (build); report: $$report" >&2; exit 1; \
	fi; \
	elapsed=$$(( $$(date +%s) - start )); \
	$(PYTHON) -m fairring.bench.gpu_check --report "$$report" --build-log "$$log" --build-seconds $$elapsed \
	  --build-command "$$build" --budget $$(( $(GPU_CHECK_SECONDS) - elapsed )) $(GPU_CHECK_ARGS); \
	status=$$?; rm -f "$$log"; \
	if [ ! -s "$$report" ]; then echo "# fairring GPU check: FAILED (the check wrote no report; exit $$status)" >"$$report"; fi; \
	exit $$status
