# protrain — top-level build: a table of contents over mk/*.mk.
#   make          plugin, cuda backend (when nvcc exists), sample_host, tests
#   make help     every target with one line on what it does
#   make test     build and run every test suite (cmocka), non-zero on failure
#   make run      the main job: train the default model with the plugin
#   make asan / make tsan   sanitizer builds running the same tests
#   make fuzz     libFuzzer targets (clang) for FUZZ_SECONDS each
#   make deps     install the Debian packages (root) or print the apt-get line
#
# Where things live:
#   mk/flags.mk    compiler flags, pkg-config, the layers' include paths, SAN modes
#   mk/deps.mk     the Debian packages (deps, check-deps, missing-debs)
#   mk/gpu.mk      GPU-machine logistics: PT_DEBROOT, gpu-debs, test-gpu, bench-gpu,
#                  bench-peers, peers-wheels
#   mk/build.mk    sources, objects, the plugin, planner CLI, sample_host, test binaries
#   mk/cuda.mk     the CUDA libraries (backend, NCCL transport, sample_host's layers)
#   mk/test.mk     test, asan, tsan, run, bench, bench-nvme, clean
#   mk/python.mk   the PyTorch host's environment (build/venv), its allocator shim,
#                  bench-torch
#   mk/fuzz.mk     libFuzzer targets (clang): fuzz, fuzz-build
#   mk/install.mk  install, uninstall
#   mk/lint.mk     lint (ruff, make test runs it), format-check, format (clang-format)
#
# Sources are picked up by wildcard so a new file needs no Makefile edit:
#   plugin/*.c runtime/*/*.c runtime/*/*/*.c gpu/*.c gpu/host/*.c gpu/coll/*.c
#   gpu/coll/mpi/*.c gpu/coll/host/*.c
#                                                -> build/protrain_plugin.so (+ libprotrain_core.a)
#   gpu/cuda/*.cu gpu/cuda/*.c                  -> build/libprotrain_cuda.so
#   gpu/coll/nccl/*.c gpu/coll/nccl/cuda/*.cu    -> build/libprotrain_nccl.so (when nccl.h exists)
#   sample_host/*.c (main.c separately)         -> build/sample_host
#   sample_host/cuda/*.cu                        -> build/libsample_cuda.so (dlopened by sample_host)
#   tests/unit/test_*.c tests/integ/test_*.c     -> build/tests/test_*   (cmocka)
#   tests/plugins/*.c                            -> build/tests/plugins/*.so
#   tests/bench/bench_*.c                        -> build/bench/bench_*

BUILD ?= build
CC ?= gcc
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
SAN ?=
OPT ?= -O2
# (the rules of mk/gpu.mk and mk/deps.mk come first; the goal stays all)
.DEFAULT_GOAL := all

include mk/flags.mk
include mk/deps.mk
include mk/gpu.mk
include mk/build.mk
include mk/cuda.mk

.PHONY: all help test test-gpu bench-gpu fuzz fuzz-build run bench asan tsan deps check-deps clean cuda-notice nccl-notice \
        timeline-example
all: check-deps $(PLUGIN) $(CUDA_TARGET) $(SAMPLE) $(PLAN_CLI) $(TEST_BINS) $(TPLUG_SOS) $(BENCH_BINS) ## plugin, cuda backend (when nvcc exists), sample_host, tests

include mk/test.mk
include mk/python.mk
include mk/fuzz.mk
include mk/install.mk
include mk/lint.mk

# make help: the targets whose rule carries a "## what it does" comment.
help: ## this list
	@sed -n 's/^\([a-zA-Z][a-zA-Z_-]*\):[^#]*## \(.*\)/\1\t\2/p' $(MAKEFILE_LIST) | \
	  awk -F'\t' '{ printf "  make %-18s %s\n", $$1, $$2 }'

-include $(shell find $(BUILD)/obj $(BUILD)/tests $(BUILD)/bench -maxdepth 8 -name '*.d' 2>/dev/null)
