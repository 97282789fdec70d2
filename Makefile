# kvserde - thin wrapper over CMake. The README's two commands:
#   make demo    build and run the tool's main job
#   make test    build everything and run every test
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build demo test bench bench-pipeline bench-small install clean

all: build

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/kvserde demo

test: build
	@cd $(BUILD) && { ctest --output-on-failure -j $(JOBS); rc=$$?; \
	  grep -ho '=* [0-9]* passed.* in [0-9.]*s =*' Testing/Temporary/LastTest.log \
	    | sed 's/^/python_binding (pytest): /'; exit $$rc; }

bench: build
	./$(BUILD)/bench_fp8

# Framed pipelines against fp8, memcpy and the streaming limit (256 MiB of
# bfloat16, 1 and 2 threads); BENCH_ARGS="--runs 9" etc.
bench-pipeline: build
	./$(BUILD)/bench_pipeline $(BENCH_ARGS)

# Small objects one task at a time and in batches of 64 (8 KiB, 1 MiB, 32 MiB),
# memory and fs, bare and through the fp8 serde wrapper: per-object latency
# and throughput over 10 runs; BENCH_ARGS="--runs 20 --fsync" etc.
bench-small: build
	./$(BUILD)/bench_small $(BENCH_ARGS)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)

# ---------------------------------------------------------------------------
# Hardening (docs/hardening.md)
#   make check     the whole test suite in the normal build ($(BUILD)), an
#                  ASan+UBSan build ($(ASAN_BUILD)) and a TSan build
#                  ($(TSAN_BUILD)); fails if any test fails in any of them
#   make fuzz      build the libFuzzer targets with clang ($(FUZZ_BUILD)) and
#                  run each for FUZZ_SECONDS seconds (fuzz/README.md)
#   make valgrind  the normal build's test suite under valgrind memcheck
# ---------------------------------------------------------------------------
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
VALGRIND_OPTIONS ?= --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect --track-fds=yes --trace-children=no

.PHONY: check check-plain check-asan check-tsan release fuzz valgrind aarch64

check: setup
	@failed=""; \
	for b in plain asan tsan; do \
	  t0=$$(date +%s); \
	  $(MAKE) --no-print-directory check-$$b || failed="$$failed $$b"; \
	  echo "make check: $$b build done in $$(( $$(date +%s) - t0 ))s"; \
	done; \
	if [ -n "$$failed" ]; then echo "make check: FAILED in:$$failed"; exit 1; fi; \
	echo "make check: every test passed in the normal, ASan+UBSan and TSan builds"

check-plain: test

check-asan check-tsan: check-%: setup
	@dir=$(if $(filter asan,$*),$(ASAN_BUILD),$(TSAN_BUILD)); \
	san=$(if $(filter asan,$*),address,thread); \
	cmake -S . -B $$dir -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_SANITIZE=$$san \
	  -DKVS_BUILD_BENCH=OFF $(CMAKE_FLAGS) >/dev/null && \
	cmake --build $$dir -j $(JOBS) && \
	cd $$dir && ctest --output-on-failure -j $(JOBS)

# The Release build type (-O3: more inlining, and more of GCC's
# maybe-uninitialized and format-truncation analysis, under -Werror), built
# whole and its tests run: a user's `cmake -DCMAKE_BUILD_TYPE=Release`.
RELEASE_BUILD ?= build-release
release: setup
	@cmake -S . -B $(RELEASE_BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(RELEASE_BUILD) -j $(JOBS)
	@cd $(RELEASE_BUILD) && ctest --output-on-failure -j $(JOBS)

fuzz: setup
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DKVS_BUILD_FUZZ=ON -DKVS_BUILD_TESTS=OFF -DKVS_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_all
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh $(FUZZ_BUILD)

valgrind: build
	cd $(BUILD) && ctest -T memcheck -j $(JOBS) --output-on-failure \
	  --overwrite MemoryCheckCommand=$$(command -v valgrind) \
	  --overwrite "MemoryCheckCommandOptions=$(VALGRIND_OPTIONS)"

# The library compiles (and links) for aarch64 without the x86 kernels.
aarch64: setup
	@bash scripts/check-aarch64.sh
