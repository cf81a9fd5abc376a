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

# The checkout, installed editable without compiling (setup.py's FAIRRING_WITH_EXTENSION):
# its entry point lets init_process_group("fairring") work without `import fairring`.
EDITABLE := $(VENV)/.fairring-editable
$(EDITABLE): $(INSTALLED) setup.py
	FAIRRING_WITH_EXTENSION=0 $(PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	touch $@

# FAIRRING_WITH_CUDA=auto|1|0 (see setup.py); CI sets 1 so a lost CUDA path fails.
build: $(EDITABLE)
	CXX=$(BUILD_CXX) MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py --quiet build_ext --inplace

# pytest's exit code 5 (no test ran) is a failure here. CI's tier: pyproject.toml's -m leaves out the
# tests marked `extended` (make test-extended); each test has a time budget (tests/tiers.py), which
# test-oldest and sanitize, slower by design, turn off (FAIRRING_TEST_BUDGET_S=0): make test enforces it.
test: build
	$(PY) -m pytest tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: no test ran" >&2; exit 1; fi; exit $$status

# The pure-logic tests, for a quick check while working (seconds; no ranks, no network):
# settings, sizes, plans, the cost model, topology, interface and transport choice, staging,
# the checks of peers' input, and the source tree against docs/design.md.
QUICK_TESTS := tests/test_source_tree.py tests/test_sizes.py tests/test_config.py tests/test_model.py \
	tests/test_plans.py tests/test_topology.py tests/test_interfaces.py tests/test_transports.py \
	tests/test_nixl_settings.py tests/test_staging.py tests/test_untrusted_peers.py tests/test_options.py \
	tests/test_nixl_wire.py tests/test_nixl_mesh_fake.py tests/test_tensorpipe_wire.py
.PHONY: test-quick
test-quick: build
	$(PY) -m pytest -q $(QUICK_TESTS)

# The whole suite with the rails on NIXL (FAIRRING_RAILS_TRANSPORT=nixl), the group churn at 20
# cycles: outside CI, which runs tests/test_nixl_*.py and the kill, freeze, mismatch, churn (5
# cycles) and soak (500 operations) tests on NIXL inside `make test`. Tests that exercise
# TensorPipe itself (its listener, the emulated device's channel) pin it, and still run on it.
.PHONY: test-nixl
test-nixl: build
	FAIRRING_RAILS_TRANSPORT=nixl FAIRRING_TEST_NIXL_FULL=1 MALLOC_ARENA_MAX=2 $(PY) -m pytest tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test-nixl: no test ran" >&2; exit 1; fi; exit $$status

# The oldest supported torch (requirements-oldest.txt): its own venv, the
# extension built out of tree (build/oldest), and the tests that do not
# depend on timing or namespaces run against it.
OLDEST_VENV := .venv-oldest
# The emulated device and the memory order exercise fairring's own ordering code, not torch's:
# `make test` runs them; here they would only repeat it, at minutes of CI time. The synchronous
# ops run here on the emulated device all the same: what they check is torch's side of a Work
# (its Python waits for a synchronous op's, and takes none from NCCL since 2.8).
OLDEST_TESTS ?= tests/test_build.py tests/test_engine.py tests/test_plans.py tests/test_collectives.py \
	tests/test_rails_protocol.py tests/test_registration.py tests/test_cuda.py \
	tests/test_drop_in.py tests/test_tracing.py tests/test_summary.py tests/test_synchronous_ops.py
OLDEST_DESELECT ?= not random_all_reduces
$(OLDEST_VENV)/.installed: requirements-oldest.txt
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet -r requirements-oldest.txt
	touch $@

# The out-of-tree builds (oldest torch, sanitizers) are remade when a tracked source changes: a stamp
# file each, so that CI can make them beside `make test` (.ci/run) and the test targets then find them made.
EXTENSION_SOURCES := setup.py $(shell git ls-files csrc 'fairring/*.py' 'fairring/bench/*.py' 2>/dev/null)
OLDEST_BUILT := build/oldest/.built
$(OLDEST_BUILT): $(OLDEST_VENV)/.installed $(EXTENSION_SOURCES)
	rm -rf build/oldest && mkdir -p build/oldest/fairring
	cp -r fairring/*.py fairring/bench build/oldest/fairring/
	CXX=$(BUILD_CXX) MAX_JOBS=$${MAX_JOBS:-2} $(OLDEST_VENV)/bin/python setup.py --quiet build_ext \
		--build-lib build/oldest --build-temp build/oldest-temp
	touch $@
.PHONY: oldest-build
oldest-build: $(OLDEST_BUILT)

test-oldest: $(OLDEST_BUILT)
	FAIRRING_TEST_BUDGET_S=0 $(OLDEST_VENV)/bin/pytest -p no:cacheprovider -o pythonpath=build/oldest -k "$(OLDEST_DESELECT)" $(OLDEST_TESTS); \
	status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test-oldest: no test ran" >&2; exit 1; fi; exit $$status

# AddressSanitizer and UBSan: the extension built a second time, out of tree (build/sanitize),
# with FAIRRING_SANITIZE (setup.py), and the tests that drive its parsing of peers' input
# (hellos, notices, heartbeats' ledger reports, malformed handshakes over the wire), the rails
# protocol, staging, the engine on CPU and on the emulated device (the CUDA engine's
# ordering), the order of collectives on shared memory, the flight recorder's hooks (every
# Work handed out wrapped and reported), shutdown, failures and rails that fail over run
# against it, first
# .ci/sanitize_check.py, which fails unless the test process and a spawned rank import that
# build. SANITIZE_DESELECT keeps it within CI's time: one test of each class of C++ path, not
# every layout, transport and size make test crosses it with. Left out: DDP models; the 1x4,
# 2x3, 3x1 and 3x2 pools, and a class's runs on 1x2 and 4x1 (its 2x2 run stays); the memory
# order tests at one slice (several slices, the last one padded, stay); negative controls (each shows its test can fail, by a switch in code the ordered case runs too); the
# emulated device's random runs, its forced interleaving, and its runs in launch order
# throughout, with a rail failing over, and with a lazily made engine (the same tensor in issue
# order, the arrival fences, the launch in turn and the eager engine stay); the second
# transport of the frozen-rank and churn tests (NIXL's killed-rank test stays); the timeouts
# moved by set_timeout and an op's own timeout (the frozen rank's stays); the flight recorder's
# trace analysis and its dump on a timeout (its hooks' test stays); the size and order
# mismatches (kind and dtype stay), and the dtype and op mismatches of all-reduces (size, on
# both transports, stays); the thread-name check (prctl only); the second way of stopping a
# blocked step, and a group whose abort never returns (abort of a blocked step stays); shared
# memory's steps at 5 of 7 sizes and types; and the namespace test (it runs iproute2's `ip` under ASan,
# which reports ip's own overlapping strncpy). Each of these runs in make test.
# Python is not instrumented, so the runtimes are preloaded, and every spawned rank inherits
# them: libasan (which must come first), and libstdc++, which Python does not link, so that
# ASan finds the __cxa_throw it wraps (without it, the first C++ exception aborts with
# "CHECK failed: real___cxa_throw"). detect_leaks=0: CPython and torch leave memory to the
# OS at exit. quarantine_size_mb=64 (ASan's default is 256): freed memory stays resident while
# quarantined, so test_lifecycle's check that churning groups does not grow the RSS measured
# the quarantine filling (+36 MiB over 17 groups in half the runs once staging shrank to
# 24 MiB, against +2 MiB without ASan); 64 MiB still holds several engines' frees. The first finding ends its process with exit code 1 (-fno-sanitize-recover=all,
# halt_on_error): a rank's fails its test ("rank N exited"), pytest's ends the run. ASan
# writes each report to build/sanitize-logs/asan.<pid>. UBSan (libubsan, loaded with the
# extension) writes to stderr whatever its log_path (libasan's __sanitizer_set_report_path
# takes its call), so --capture=sys leaves stderr uncaptured, where pytest would lose it with
# a process that dies, and the output is kept in build/sanitize-logs/output. Any report at
# all, even from a rank that a test killed anyway or expected to fail, fails the target.
SANITIZE_TESTS ?= .ci/sanitize_check.py tests/test_untrusted_peers.py tests/test_wire_fuzz.py tests/test_nixl_wire.py \
	tests/test_nixl_mesh_fake.py tests/test_tensorpipe_wire.py \
	tests/test_mismatches.py tests/test_rails_protocol.py tests/test_staging.py tests/test_config.py \
	tests/test_topology.py tests/test_engine.py tests/test_plans.py tests/test_lifecycle.py tests/test_failures.py \
	tests/test_shared_memory.py tests/test_memory_order.py tests/test_emulated_device.py \
	tests/test_flight_recorder.py tests/test_group_steps.py tests/test_launch_order.py \
	tests/test_rails_failover.py
SANITIZE_DESELECT ?= not ddp_matches_gloo and not 1x4 and not 2x3 and not 3x1 and not link_goes_down \
	and not ((random_all_reduces or same_tensor_twice) and interleaved) and not (no_cuda_engine and (interleaved or 4x1)) and not fits[2] \
	and not negative_control and not in_order_unordered_launch and not without_failover \
	and not kept-for-resends and not runs_in_launch_order and not on_a_launch_order_device and not (first_collective and lazy) \
	and not (frozen_rank and nixl) and not (making_and_destroying_groups and nixl) and not set_timeout \
	and not own_timeout and not fr_trace and not (naming_both and (size or order)) \
	and not (stopping_returns and destroy) and not (steps_match_torch and (sum-1] or product or max or min)) \
	and not 3x2 and not random_all_reduces_from_two_groups and not forced_interleaving and not dump_before_exit \
	and not abort_never_returns and not (1x2 and (mixed_sizes or non_contiguous or no_cuda_engine)) \
	and not (4x1 and (mixed_sizes or non_contiguous)) and not 2x2-65536] \
	and not dtype-tensorpipe and not op-tensorpipe and not threads_are_named and not 4-uint8-sum
SANITIZE_LOGS := build/sanitize-logs
.PHONY: sanitize
SANITIZE_BUILT := build/sanitize/.built
$(SANITIZE_BUILT): $(INSTALLED) $(EXTENSION_SOURCES)
	rm -rf build/sanitize && mkdir -p build/sanitize/fairring
	cp -r fairring/*.py fairring/bench build/sanitize/fairring/
	CXX=$(BUILD_CXX) FAIRRING_SANITIZE=address,undefined MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py --quiet build_ext \
		--build-lib build/sanitize --build-temp build/sanitize-temp
	touch $@
.PHONY: sanitize-build
sanitize-build: $(SANITIZE_BUILT)

sanitize: $(SANITIZE_BUILT)
	rm -rf $(SANITIZE_LOGS) && mkdir -p $(SANITIZE_LOGS)
	{ LD_PRELOAD="$$($(BUILD_CXX) -print-file-name=libasan.so) $$($(BUILD_CXX) -print-file-name=libstdc++.so)" \
	  ASAN_OPTIONS=detect_leaks=0:quarantine_size_mb=64:log_path=$(abspath $(SANITIZE_LOGS))/asan \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 FAIRRING_TEST_BUDGET_S=0 \
	  $(VENV)/bin/pytest -p no:cacheprovider --capture=sys -o pythonpath=build/sanitize \
		-k "$(SANITIZE_DESELECT)" $(SANITIZE_TESTS) 2>&1; echo $$? >$(SANITIZE_LOGS)/status; } | \
	tee $(SANITIZE_LOGS)/output; status=$$(cat $(SANITIZE_LOGS)/status); \
	if [ $$status -eq 5 ]; then echo "make sanitize: no test ran" >&2; status=1; fi; \
	for report in $(SANITIZE_LOGS)/asan.*; do [ -f "$$report" ] || continue; echo "--- $$report"; cat "$$report"; status=1; done; \
	if grep -q ': runtime error: ' $(SANITIZE_LOGS)/output; then echo "make sanitize: UBSan reported (above)" >&2; status=1; fi; \
	if [ $$status -ne 0 ]; then echo "make sanitize: failed (sanitizer reports, if any, are above)" >&2; fi; exit $$status

bench: build
	$(PY) -m fairring.bench $(BENCH_ARGS)

# The long soak, outside CI (tests/test_soak.py is the short one): random collectives, each
# checked, for SOAK_ARGS (default 10 minutes), then threads, descriptors and RSS against the warm-up.
SOAK_ARGS ?= --minutes 10
.PHONY: soak
soak: build
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

# A rail's NIC down and back under all-reduces, timed (tests/test_rails_failover.py is the
# short, checked run): bandwidth and bytes by NIC through the episode; needs network namespaces.
.PHONY: failover-episode
failover-episode: build
	$(PY) benchmarks/failover_episode.py $(FAILOVER_ARGS)

# The extended tier (tests marked `extended`, tests/tiers.py), outside CI: the layouts beyond CI's
# (the engine's reduce-scatter and all-gather on 4x2) and the emulated device's long run, STRESS_OPS
# all-reduces per layout (half on each of two groups) on 2x3 and 4x2, every result checked. Each
# guards a class that a shorter test in `make test` guards too; none has CI's per-test time budget.
STRESS_OPS ?= 4000
.PHONY: test-extended
test-extended: build
	FAIRRING_STRESS_OPS=$(STRESS_OPS) $(PY) -m pytest -m extended tests $(TEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test-extended: no test ran" >&2; exit 1; fi; exit $$status

# What the CUDA engine's launch order costs back-to-back buckets, on the emulated device: 8 x 25 MiB
# with the launch order and without, 2x2 and 3x2, loopback and 1 Gbit/s (docs/benchmarks.md).
.PHONY: launch-order-cost
launch-order-cost: build
	$(PY) benchmarks/launch_order_cost.py $(LAUNCH_ORDER_ARGS)

# Threads and CPU time per rank, idle and busy, 2 machines x 8 ranks on the emulated device
# (benchmarks/rank_threads.py; RANK_THREADS_ARGS=--layout 2x2 for another layout).
.PHONY: rank-threads
rank-threads: build
	$(PY) benchmarks/rank_threads.py $(RANK_THREADS_ARGS)

# What a delegated collective costs through fairring against its delegate called directly, issued as
# FSDP2, ZeRO and DDP issue them (benchmarks/delegated_cost.py; DELEGATED_COST_ARGS=--device cuda on a GPU).
.PHONY: delegated-cost
delegated-cost: build
	$(PY) benchmarks/delegated_cost.py $(DELEGATED_COST_ARGS)

# fairring against every supported torch, outside CI (which takes the oldest and the newest): each
# from PyPI in .venv-torch/<version>, built out of tree, imported, then a 2x2 smoke
# (benchmarks/torch_versions.py; TORCH_VERSIONS_ARGS="--versions 2.13.0" for one).
.PHONY: test-torch-versions
test-torch-versions:
	$(PYTHON) benchmarks/torch_versions.py $(TORCH_VERSIONS_ARGS)

# Where one engine op's time goes, stage by stage, against Gloo's op: 2 x 2 on loopback
# (benchmarks/op_breakdown.py; OP_BREAKDOWN_ARGS="--collective all_gather --sizes 4MiB" for one).
.PHONY: op-breakdown
op-breakdown: build
	$(PY) benchmarks/op_breakdown.py $(OP_BREAKDOWN_ARGS)

# What counting and timing each collective for fairring.summary() costs, against a 4-byte all-reduce.
.PHONY: summary-cost
summary-cost: build
	$(PY) benchmarks/summary_cost.py

lint: $(INSTALLED)
	$(PY) -m ruff check setup.py fairring tests benchmarks
	$(PY) -m ruff format --check setup.py fairring tests benchmarks
	git ls-files 'csrc/*.cpp' 'csrc/*.h' | xargs $(VENV)/bin/clang-format --dry-run --Werror

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
	$(WHEEL_VENV)/bin/python -m pip install --quiet --no-deps dist/torch_fairring-*.whl
	cd "$$(mktemp -d)" && $(abspath $(WHEEL_VENV))/bin/python $(abspath tests/wheel_smoke.py)

# The GPU check: on a machine with a GPU and torch but no network (no venv, no pip), prints what
# it found (python, torch and its CUDA, the CUDA headers, the compiler, nvcc, cores), builds
# fairring against $(PYTHON)'s torch, then runs the stages of benchmarks/gpu_check/ in order of
# value: the contract, FSDP2, then the engine against NCCL on network namespaces shaped to 10 and
# 25 Gbit/s (the last two need iproute2: where the machine lacks it, carry .gpu-tools from
# `make gpu-tools`), and the rest. The report,
# FAIRRING_GPU_REPORT (default gpu-check-report.md), is rewritten after every stage. GPU_CHECK_ARGS go to `python -m benchmarks.gpu_check` (see
# its --help), e.g. --quick or "--device cpu" (with FAIRRING_WITH_CUDA=auto, where there is no
# CUDA). A failed build writes the report too. Whole check: GPU_CHECK_SECONDS (the build's time
# counts); each stage gets a bounded share, and one the time left cannot fit is reported skipped.
GPU_REPORT ?= gpu-check-report.md
GPU_CHECK_SECONDS ?= 540
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
	found="$$( \
	  $(PYTHON) -c 'import sys; print(f"python: {sys.executable} {sys.version.split()[0]}")' 2>/dev/null \
	    || echo "python: $(PYTHON) does not run"; \
	  $(PYTHON) -c 'import torch; print(f"torch: {torch.__version__}, torch.version.cuda: {torch.version.cuda}")' \
	    2>/dev/null || echo "torch: $(PYTHON) cannot import torch"; \
	  echo "CUDA headers (CUDA_HOME): $${CUDA_HOME:-none}"; \
	  cxx="$$($$CXX --version 2>/dev/null | head -n 1)"; echo "compiler: $$CXX: $${cxx:-not found}"; \
	  nvcc="$$(command -v nvcc >/dev/null 2>&1 && nvcc --version 2>&1 | tail -n 1)"; echo "nvcc: $${nvcc:-none}"; \
	  echo "cores: $$(nproc 2>/dev/null || echo unknown)")"; \
	echo "$$found" | sed 's/^/gpu-check: /'; \
	build="CXX=$$CXX FAIRRING_WITH_CUDA=$$FAIRRING_WITH_CUDA MAX_JOBS=$$MAX_JOBS CUDA_HOME=$${CUDA_HOME:-} $(PYTHON) setup.py --quiet build_ext --inplace"; \
	echo "gpu-check: $$build"; \
	if ! timeout $(GPU_BUILD_SECONDS) $(PYTHON) setup.py --quiet build_ext --inplace >"$$log" 2>&1; then \
	  { echo "# fairring GPU check: FAILED (build)"; echo; echo "Found:"; echo; echo '```text'; echo "$$found"; echo '```'; \
	    echo; echo "The build failed or ran past $(GPU_BUILD_SECONDS) s:"; \
	    echo; echo '```sh'; echo "$$build"; echo '```'; echo; echo '```text'; tail -n 200 "$$log"; echo '```'; } >"$$report"; \
	  tail -n 60 "$$log" >&2; rm -f "$$log"; echo "gpu-check: FAILED (build); report: $$report" >&2; exit 1; \
	fi; \
	elapsed=$$(( $$(date +%s) - start )); \
	$(PYTHON) -m benchmarks.gpu_check --report "$$report" --build-log "$$log" --build-seconds $$elapsed \
	  --build-command "$$build" --budget $$(( $(GPU_CHECK_SECONDS) - elapsed )) $(GPU_CHECK_ARGS); \
	status=$$?; rm -f "$$log"; \
	if [ ! -s "$$report" ]; then echo "# fairring GPU check: FAILED (the check wrote no report; exit $$status)" >"$$report"; fi; \
	exit $$status

# iproute2 (ip, tc) and the libraries it needs, from the GPU machine's release (Ubuntu 24.04 on
# the lent H200s), into .gpu-tools/ (git ignores it): run where the network is, then carry
# .gpu-tools in the call to the GPU machine, whose check unpacks the packages it lacks into a
# folder of their own (benchmarks/gpu_tools.py). The index is not signature-checked (this
# machine may hold no Ubuntu keyring): the packages only ever run on that throwaway machine.
GPU_TOOLS_MIRROR ?= http://archive.ubuntu.com/ubuntu
GPU_TOOLS_SUITE ?= noble
GPU_TOOLS_PACKAGES ?= iproute2 libbpf1 libelf1t64 libmnl0 libxtables12 libtirpc3t64 libtirpc-common libatm1t64 libcap2 libdb5.3t64
.PHONY: gpu-tools
gpu-tools:
	@set -e; state="$$(mktemp -d)"; trap 'rm -rf "$$state"' EXIT; \
	mkdir -p "$$state/lists/partial" "$$state/cache/archives/partial" .gpu-tools; \
	echo "deb [trusted=yes arch=amd64] $(GPU_TOOLS_MIRROR) $(GPU_TOOLS_SUITE) main" >"$$state/sources.list"; \
	apt="apt-get -q -oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$$state/lists \
	  -oDir::Etc::SourceList=$$state/sources.list -oDir::Etc::SourceParts=/dev/null -oDir::Cache=$$state/cache \
	  -oDir::State::status=/dev/null"; \
	$$apt update >/dev/null; rm -f .gpu-tools/*.deb; (cd .gpu-tools && $$apt download $(GPU_TOOLS_PACKAGES) >/dev/null); \
	ls .gpu-tools; echo "gpu-tools: carry .gpu-tools in the call that runs make gpu-check"
