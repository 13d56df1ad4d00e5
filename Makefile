# DataHelix top-level Makefile: the two commands of README.md, and the pieces under them.
#   make demo   install what is missing (make deps), build, run the demo
#   make test   install what is missing (make deps), build, run the unit tests and the
#               Python tests, then both again under AddressSanitizer +
#               UndefinedBehaviorSanitizer, then the runtime tests under ThreadSanitizer, then
#               each libFuzzer target for 100,000 executions
#   make        build only; installs nothing (a missing dependency: cmake says which, and
#               to run `make deps`)
# Build folders: build/ (RelWithDebInfo), build-asan/ (ASan+UBSan), build-tsan/ (TSan),
# build-fuzz/ (clang, libFuzzer + ASan+UBSan).
# Python: the project's virtual environment .venv (made by `make deps` from requirements.txt);
# every target that runs Python uses $(VENV)/bin/python, builds configure the extension for
# it (-DPython3_EXECUTABLE), and the CLI's Python steps get it as DH_PYTHON_EXE.
# Outputs: out/.

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
CLI        := $(BUILD)/datahelix
DEMO_DIR   ?= out/demo

# The project's virtual environment and its interpreter (make deps creates it).
VENV       ?= .venv
VENV_PY    := $(abspath $(VENV))/bin/python
ASAN_FLAGS := -DCMAKE_BUILD_TYPE=Debug -DDH_SANITIZE=address,undefined -DDH_ENABLE_FAULTS=ON
TSAN_FLAGS := -DCMAKE_BUILD_TYPE=Debug -DDH_SANITIZE=thread
FUZZ_FLAGS := -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDH_FUZZ=ON \
              -DDH_SANITIZE=address,undefined -DDH_BUILD_TESTS=OFF -DDH_PYTHON=OFF

.PHONY: all deps build test test-unit test-python test-asan test-tsan fuzz-build test-fuzz fuzz mutate soak soak-chaos soak-memory demo bench-peers bench-peers-data-bound bench-python sim-validate format format-check clean help

all: build

help:
	@echo "make / build    configure and build the library, the CLI, the Python extension and the tests (installs nothing)"
	@echo "make deps       install missing Debian packages, and requirements.txt into .venv (idempotent)"
	@echo "make test       deps + build + unit and Python tests, both again under ASan/UBSan, runtime under TSan, fuzz targets"
	@echo "make test-unit  the C tests (ctest)    make test-python  the pytest suite (tests/python, in .venv)"
	@echo "make fuzz       the libFuzzer targets (tests/fuzz), FUZZ_SECONDS (60) each; test-fuzz: 100,000 runs each (in make test)"
	@echo "make mutate     the mutation check of the tests (scripts/mutate.py, docs/testing.md; not in make test)"
	@echo "make demo       deps + build + the demo: planning, placement, decode, the data plane as processes, native vs pool vs helix (real decode and emulated paper scale)"
	@echo "make bench-peers  torch DataLoader vs Ray actor pool vs datahelix.DataLoader (bench/peers)"
	@echo "make bench-peers-data-bound  the same with compute small enough that decode dominates"
	@echo "make soak       the chaos soak for SOAK_SECONDS (1800): kill -9, SIGSTOP and restarts during a 4-rank run;"
	@echo "                then the memory soak for SOAK_MEMORY_SECONDS (1800): every process's RSS per epoch (soak-chaos, soak-memory: one)"
	@echo "make bench-python  a Python Dataset: bench --python-dataset, and datahelix vs torch DataLoader overhead"
	@echo "make sim-validate  bench --emulate against simulate at the paper layout, same seed; fails past the tolerances (docs/simulator.md; an idle machine)"
	@echo "make format     clang-format the C sources in place (format-check: only report)"

deps:
	@DH_VENV=$(abspath $(VENV)) bash scripts/deps.sh

# $(call configure,DIR,CMAKE_ARGS): configures DIR when it has no cache yet, with the venv's
# interpreter when there is a venv; and again when a venv appeared since (e.g. `make` ran
# before the first `make deps`), so the extension is built for the interpreter that imports it.
# Tools missing before cmake can say anything: point at `make deps`.
define configure
	@set -e; py=""; \
	if [ -x "$(VENV_PY)" ]; then py="-DPython3_EXECUTABLE=$(VENV_PY)"; fi; \
	if [ ! -f $(1)/CMakeCache.txt ]; then \
	    for tool in cmake cc pkg-config; do command -v $$tool >/dev/null 2>&1 || { \
	        echo "make: $$tool not found; run 'make deps' to install what is missing (README: Dependencies)" >&2; \
	        exit 1; }; done; \
	    echo "cmake -S . -B $(1) $(GENERATOR) $(2) $$py"; \
	    cmake -S . -B $(1) $(GENERATOR) $(2) $$py; \
	elif [ -n "$$py" ] && ! grep -qx "Python3_EXECUTABLE:[A-Z]*=$(VENV_PY)" $(1)/CMakeCache.txt; then \
	    echo "cmake -S . -B $(1) $$py"; \
	    cmake -S . -B $(1) $$py; \
	fi
endef

build:
	$(call configure,$(BUILD),-DCMAKE_BUILD_TYPE=RelWithDebInfo)
	cmake --build $(BUILD) -j $(JOBS)

# A target that runs Python needs the venv; without it, say how to make it.
$(VENV_PY):
	@echo "make: no $(VENV)/bin/python; run 'make deps' (creates $(VENV) from requirements.txt)" >&2; exit 1

# The C tests; the two that run Python (decode-bench's PyAV side, bench --plot) use the
# interpreter the build was configured with (DH_PYTHON_EXE, set by ctest: the venv's).
test-unit: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Then the pytest suite again with the extension (and the CLI it runs) built with ASan+UBSan:
# the interpreter is not instrumented, so the runtime is preloaded, and leak checking is off
# (CPython keeps objects alive at exit by design); memory errors and UB still abort.
ASAN_RT    = $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libubsan.so)
test-asan: $(VENV_PY)
	$(call configure,$(ASAN_BUILD),$(ASAN_FLAGS))
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)
	LD_PRELOAD="$(ASAN_RT)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=1 DH_CLI=$(abspath $(ASAN_BUILD))/datahelix \
	    DH_PYTHON_PATH=$(abspath $(ASAN_BUILD))/python $(VENV_PY) -m pytest -q -p no:cacheprovider tests/python

# ThreadSanitizer over the runtime tests (the client, the DataServer and the coordinator, in
# process and as real processes built with TSan too), the remote cache shared by threads, and
# the cache in use with its read-ahead threads.
# Every tests/runtime/test_*.c executable (runtime_test_*), so a new runtime test file is
# built here as well as run by the -R filter below.
TSAN_TESTS := $(patsubst tests/runtime/%.c,runtime_%,$(wildcard tests/runtime/test_*.c)) \
              remote_test_cache_shared remote_test_cache_fetch
test-tsan:
	$(call configure,$(TSAN_BUILD),$(TSAN_FLAGS))
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target datahelix_cli $(TSAN_TESTS)
	TSAN_OPTIONS=halt_on_error=1:exitcode=66:suppressions=$(CURDIR)/tests/sanitizers/tsan.supp \
	    ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) \
	        -R '^(runtime\.|remote\.test_cache_(shared|fetch)\.)'

# The libFuzzer targets of the parsers of untrusted input (tests/fuzz, docs/testing.md
# "Fuzzing"): the wire codec, manifests, profiles JSONL, pipeline specs, mix files, the Python
# worker's messages, `datahelix manifest`'s CSV and tar readers and the metrics endpoint, built
# with clang (libFuzzer comes with it; `make deps` installs clang and libclang-rt-14-dev)
# in build-fuzz/, the library included, under ASan+UBSan. Each runs on a scratch copy of its
# seed corpus (tests/fuzz/corpus/<target>/; scripts/fuzz.sh), stopping at the first finding.
# test-fuzz (in `make test`): 100,000 executions per target, ~40 s for the nine on the 2-core
# CI machine. fuzz: FUZZ_SECONDS each (FUZZ_TARGETS="wire mix" for some).
FUZZ_SECONDS ?= 60
FUZZ_RUNS    ?= 100000
FUZZ_TARGETS ?=
fuzz-build:
	@command -v clang >/dev/null 2>&1 || { echo "make: clang not found; run 'make deps' (clang, libclang-rt-14-dev: libFuzzer)" >&2; exit 1; }
	$(call configure,$(FUZZ_BUILD),$(FUZZ_FLAGS))
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target dh_fuzz

test-fuzz: fuzz-build
	bash scripts/fuzz.sh $(FUZZ_BUILD) --runs $(FUZZ_RUNS) $(FUZZ_TARGETS)

fuzz: fuzz-build
	bash scripts/fuzz.sh $(FUZZ_BUILD) --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The Python package (build/python/datahelix) under pytest in the venv: the DataLoader
# against real servers, the error classes, and examples/train_ddp.py under torchrun; then
# the multi-node tests over network namespaces (tests/netns: root; skipped, saying why,
# where namespaces cannot be made).
test-python: build $(VENV_PY)
	OMP_NUM_THREADS=1 DH_CLI=$(abspath $(CLI)) DH_PYTHON_PATH=$(abspath $(BUILD))/python \
	    $(VENV_PY) -m pytest -q -p no:cacheprovider tests/python
	OMP_NUM_THREADS=1 DH_CLI=$(abspath $(CLI)) DH_PYTHON_PATH=$(abspath $(BUILD))/python \
	    $(VENV_PY) -m pytest -q -rs -p no:cacheprovider tests/netns tests/soak

# The soaks, one after the other: the chaos soak for SOAK_SECONDS (30 minutes; `make test`
# runs 2 of them): tests/soak/soak.py; then the memory soak for SOAK_MEMORY_SECONDS (30
# minutes; `make test` runs 40 s of it): tests/soak/memsoak.py, every process's RSS and PSS
# per epoch, growth after the warm-up bounded (docs/operations.md, "Memory over time").
# soak-chaos and soak-memory run one of them.
SOAK_SECONDS ?= 1800
SOAK_MEMORY_SECONDS ?= 1800
SOAK_ENV = OMP_NUM_THREADS=1 DH_CLI=$(abspath $(CLI)) DH_PYTHON_PATH=$(abspath $(BUILD))/python
soak: build $(VENV_PY)
	$(SOAK_ENV) $(VENV_PY) tests/soak/soak.py --seconds $(SOAK_SECONDS) --json out/soak.json
	$(SOAK_ENV) $(VENV_PY) tests/soak/memsoak.py --seconds $(SOAK_MEMORY_SECONDS) \
	    --json out/memsoak.json

soak-chaos: build $(VENV_PY)
	$(SOAK_ENV) $(VENV_PY) tests/soak/soak.py --seconds $(SOAK_SECONDS) --json out/soak.json

soak-memory: build $(VENV_PY)
	$(SOAK_ENV) $(VENV_PY) tests/soak/memsoak.py --seconds $(SOAK_MEMORY_SECONDS) \
	    --json out/memsoak.json

# The mutation check (docs/testing.md): single-line mutants of src/, each built and tested
# in a scratch copy (build-mutate/; the working tree is never edited); fails under the
# minimum kill rate. Not part of `make test`: about 10 minutes on 2 cores once build-mutate/
# is built (the first run builds it: a full build, fault sites on).
# MUTATE_ARGS="--only NAME" for one mutant, "--list" to see them.
MUTATE_ARGS ?=
mutate:
	python3 scripts/mutate.py --jobs 1 $(MUTATE_ARGS)

# README's two commands: set-up first (make deps), then the rest in a second make, so the
# order holds under -j too.
test: deps
	@$(MAKE) --no-print-directory test-unit test-python test-asan test-tsan test-fuzz

demo: deps
	@$(MAKE) --no-print-directory build
	@DH_PYTHON_EXE=$(VENV_PY) bash scripts/demo.sh $(CLI) $(DEMO_DIR)

# The same emulated training loop fed by torch's DataLoader (PyAV), a Ray actor pool and
# datahelix.DataLoader, on fair defaults: every system's decode workers pinned the same way,
# 4 batches in flight per rank for all, efficiency from each system's own measured CPU
# (cpu_work_s), 40 steps after the warm-up, medians of 3 runs (bench/peers/README.md,
# docs/benchmarks.md); the peers' PyAV skips the non-reference frames not sampled, as
# DataHelix does (--pyav plain: decode them all). PEERS_ARGS="--no-pin" or "--own-defaults"
# for the other rows; its smoke test is tests/python/test_bench_peers.py (make
# test-python). bench-peers is the compute-bound loop, bench-peers-data-bound the same with
# --regime data-bound (compute x 0.25: every system's decode bounds it).
PEERS_ARGS ?= --runs 3 --pin --inflight 4
bench-peers: build $(VENV_PY)
	$(VENV_PY) bench/peers/run_peers.py --cli $(CLI) --json out/peers/peers.json $(PEERS_ARGS)

bench-peers-data-bound: build $(VENV_PY)
	$(VENV_PY) bench/peers/run_peers.py --cli $(CLI) --json out/peers/peers-data-bound.json \
	    --regime data-bound $(PEERS_ARGS)

# A Python Dataset in the DataServers' worker processes (docs/benchmarks.md, "A Python
# dataset" and "Python-dataset overhead"): bench --python-dataset on bench/python_dataset/
# sleepy.py, then datahelix.DataLoader against torch's over a trivial 1 MiB dataset.
bench-python: build $(VENV_PY)
	cd bench/python_dataset && DH_PYTHON_EXE=$(VENV_PY) $(abspath $(CLI)) bench \
	    --python-dataset sleepy:make --ranks 4 --batch 4 --steps 60 --warmup 6 \
	    --local-servers 1 --remote-servers 0 --cores-per-server 4 --systems native,helix \
	    --plan-window 4 --python-dir $(abspath out/python-dataset) \
	    --json $(abspath out/python-dataset/bench.json)
	$(VENV_PY) bench/python_dataset/overhead.py --runs 3 --json out/python-dataset/overhead.json

# The simulator against the emulation it models (docs/simulator.md, "Validation against
# bench --emulate"): the paper layout, same seed, throughput / miss rate / wait p95, each
# checked against its tolerance (exit 1 past it). A benchmark on the wall clock, not a test:
# run it on an idle machine (sim.test_sim.sim_agrees_with_bench_emulate asserts only what
# holds under load).
sim-validate: build
	python3 scripts/sim_validate.py $(CLI) out/sim/validate

# clang-format is installed by `make deps` as optional; without it these fail, saying so
# (CI runs format-check, so there it is required).
CLANG_FORMAT ?= clang-format
format:
	@command -v $(CLANG_FORMAT) >/dev/null 2>&1 || { echo "make format: $(CLANG_FORMAT) not found (Debian: clang-format; make deps installs it)" >&2; exit 1; }
	$(CLANG_FORMAT) -i $$(git ls-files '*.c' '*.h')

format-check:
	@command -v $(CLANG_FORMAT) >/dev/null 2>&1 || { echo "make format-check: $(CLANG_FORMAT) not found (Debian: clang-format; make deps installs it)" >&2; exit 1; }
	$(CLANG_FORMAT) --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) build-mutate out
