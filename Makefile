# Entry points. `make demo` and `make test` set up a fresh machine themselves (see README).
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
PY         ?= python3
JOBS       ?= $(shell nproc)
CMAKE_GEN  := -G Ninja

.PHONY: all deps build lint format test test-cpp test-asan test-tsan test-python test-wheel wheel demo bench fuzz clean

all: build

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

# Formatting and lint checks (CI runs them before the tests): clang-format on every C++ file,
# ruff check and ruff format on every Python file. `make format` rewrites the tree to conform.
CXX_FILES = $(shell git ls-files '*.cc' '*.h')
PY_DIRS   = python tests bench scripts

lint: deps
	clang-format --dry-run --Werror $(CXX_FILES)
	$(PY) -m ruff check $(PY_DIRS)
	$(PY) -m ruff format --check $(PY_DIRS)

format: deps
	clang-format -i $(CXX_FILES)
	$(PY) -m ruff format $(PY_DIRS)

# Every test: C++ (plain and under ASan+UBSan), then Python, then the wheel as users install it.
test: test-cpp test-asan test-python test-wheel

# A self-contained manylinux wheel in dist/ (scripts/build-wheel.sh).
wheel: deps
	bash scripts/build-wheel.sh

# The wheel installed into a throwaway venv with only torch and numpy, smoke-tested there.
test-wheel: deps
	bash scripts/test-wheel.sh

# Tests that need servers (nginx, moto S3, redis) get them from scripts/with-servers.sh, which
# also sets TZ_REQUIRE_SERVERS=1 so such tests fail rather than skip if a server is missing.
WITH_SERVERS := bash scripts/with-servers.sh

test-cpp: build
	$(WITH_SERVERS) ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTZ_SANITIZE=address,undefined
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(WITH_SERVERS) ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# ThreadSanitizer over the C++ suite (not part of `make test`: ~6 min to build and ~6 to run on
# 2 cores). A reported race makes the test exit 66, so ctest fails it.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTZ_SANITIZE=thread
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	TSAN_OPTIONS=second_deadlock_stack=1 $(WITH_SERVERS) ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS)

test-python: build
	@if [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then \
	  $(WITH_SERVERS) bash scripts/test-python.sh; \
	else echo "no Python tests yet"; fi

# The main job: save and load a real model (all-MiniLM-L6-v2) through the Python package and
# check its embeddings, then a model-sized synthetic file through the C++ API; prints throughput.
# Builds the CLI and the Python extension only, no tests.
demo: deps
	cmake -S . -B $(BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS) --target tensorizer_cli
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) bench/demo.py
	$(BUILD)/tensorizer bench --size-mb $${DEMO_SIZE_MB:-1024}

bench: build
	bash bench/run.sh

# libFuzzer on the header/index parser: FUZZ_SECONDS (default 600).
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DTZ_FUZZ=ON -DTZ_TESTS=OFF -DTZ_CLI=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	mkdir -p fuzz/corpus-run && cp fuzz/corpus/* fuzz/corpus-run/ 2>/dev/null || true
	$(FUZZ_BUILD)/fuzz_index -max_total_time=$${FUZZ_SECONDS:-600} -print_final_stats=1 \
	  -max_len=4096 fuzz/corpus-run fuzz/corpus

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
