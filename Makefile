# DataHelix top-level Makefile: the two commands of README.md, and the pieces under them.
#   make demo   install what is missing, build, run the demo
#   make test   install what is missing, build, run the unit tests and the Python tests,
#               then both again under AddressSanitizer + UndefinedBehaviorSanitizer, then
#               the runtime tests under ThreadSanitizer
# Build folders: build/ (RelWithDebInfo), build-asan/ (ASan+UBSan), build-tsan/ (TSan).
# Outputs: out/.

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
CLI        := $(BUILD)/datahelix
DEMO_DIR   ?= out/demo

.PHONY: all deps build test test-unit test-python test-asan test-tsan demo bench-peers format format-check clean help

all: build

help:
	@echo "make deps       install missing Debian/PyPI packages (idempotent)"
	@echo "make / build    configure and build the library, the CLI and the tests"
	@echo "make test       deps + build + unit and Python tests, both again under ASan/UBSan, runtime under TSan"
	@echo "make test-python  the pytest suite of the datahelix package (tests/python)"
	@echo "make demo       deps + build + the demo: planning, placement, decode, the data plane as processes, native vs pool vs helix (real decode and emulated paper scale)"
	@echo "make bench-peers  torch DataLoader vs Ray actor pool vs datahelix.DataLoader (bench/peers)"
	@echo "make format     clang-format the C sources in place (format-check: only report)"

deps:
	@bash scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test-unit: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug \
	    -DDH_SANITIZE=address,undefined -DDH_ENABLE_FAULTS=ON

# Then the pytest suite again with the extension (and the CLI it runs) built with ASan+UBSan:
# the interpreter is not instrumented, so the runtime is preloaded, and leak checking is off
# (CPython keeps objects alive at exit by design); memory errors and UB still abort.
ASAN_RT    = $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libubsan.so)
test-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)
	LD_PRELOAD="$(ASAN_RT)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=1 DH_CLI=$(CURDIR)/$(ASAN_BUILD)/datahelix \
	    DH_PYTHON_PATH=$(CURDIR)/$(ASAN_BUILD)/python python3 -m pytest -q -p no:cacheprovider tests/python

# ThreadSanitizer over the runtime tests (the client, the DataServer and the coordinator, in
# process and as real processes built with TSan too).
$(TSAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DDH_SANITIZE=thread

test-tsan: deps $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target datahelix_cli runtime_test_client runtime_test_cluster
	TSAN_OPTIONS=halt_on_error=1:exitcode=66:suppressions=$(CURDIR)/tests/sanitizers/tsan.supp \
	    ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -R '^runtime\.'

# The Python package (build/python/datahelix) under pytest: the DataLoader against real
# servers, the error classes, and examples/train_ddp.py under torchrun (tests/python).
test-python: build
	OMP_NUM_THREADS=1 DH_CLI=$(CURDIR)/$(CLI) DH_PYTHON_PATH=$(CURDIR)/$(BUILD)/python \
	    python3 -m pytest -q -p no:cacheprovider tests/python

test: test-unit test-python test-asan test-tsan

demo: build
	@bash scripts/demo.sh $(CLI) $(DEMO_DIR)

# The same emulated training loop fed by torch's DataLoader (PyAV), a Ray actor pool and
# datahelix.DataLoader, 3 runs, medians (bench/peers/README.md, docs/benchmarks.md).
PEERS_ARGS ?= --runs 3
bench-peers: build
	python3 bench/peers/run_peers.py --cli $(CLI) --json out/peers/peers.json $(PEERS_ARGS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) out
