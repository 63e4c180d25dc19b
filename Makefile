# PCP: the two commands a user needs are `make run` and `make test`.
# Each one installs what is missing (tools/setup/setup.sh), builds, and runs.
SHELL := /bin/bash
.DEFAULT_GOAL := build
PRESET ?= release
JOBS ?= $(shell nproc)

.PHONY: setup configure build run test test-unit test-asan bench bench-check lint clean
.PHONY: format
.PHONY: image image-test

setup:
	@tools/setup/setup.sh

# Configure once per build tree; cmake re-runs itself when CMakeLists change.
build/build.ninja:
	@cmake --preset release >/dev/null

build-asan/build.ninja:
	@cmake --preset asan >/dev/null

configure: setup build/build.ninja

build: setup build/build.ninja
	@cmake --build --preset release -j $(JOBS)

run: build
	@tools/quickstart.sh

test: build
	@ctest --preset release --output-on-failure
	@$(MAKE) --no-print-directory test-asan

# The same suite under AddressSanitizer + UBSan (CI runs it on every change).
test-asan: setup build-asan/build.ninja
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan --output-on-failure -LE noasan

# make bench              every benchmark
# make bench BENCH=name   one benchmark (build/bench/name)
bench: build
	@tools/bench.sh $(BENCH)

# Every benchmark with its goal (not part of `make test`): exits non-zero
# when one misses its goal, fails or prints no ratio (tools/bench.sh --check).
bench-check: build
	@tools/bench.sh --check $(BENCH)

# The OCI image localhost/pcp:<version> (and :latest) from a cached Debian
# root, no registry; the archive in build/pcp-image.tar (deploy/image/).
image: build
	@deploy/image/build.sh

# The containerised gateway + node manager test (also the ctest test
# image_cluster in `make test`).
image-test: image
	@deploy/image/test.sh

lint:
	@tools/lint/check_includes.py
	@tools/lint/check_format.py
	@tools/lint/status_idiom.py
	@tools/lint/no_raw_malloc.py

# Rewrites every C file clang-format 14 would change (.clang-format); the
# ctest lint_format fails until this has run.
format:
	@tools/lint/check_format.py --fix

clean:
	rm -rf build build-debug build-asan
