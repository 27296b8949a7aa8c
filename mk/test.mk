# Running things: make test (every suite), asan / tsan (the same under
# sanitizers), run (the main job), bench, clean.

# Tests find built artefacts through these variables.
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads of the host must not spin on the
# cores the plugin's stream and CPU-optimizer threads need (measured: test_offload
# 32 s spinning vs 2.4 s passive on 2 cores).
OMP_ENV := OMP_WAIT_POLICY=PASSIVE
# Under TSan, OpenBLAS runs on the calling thread: its own worker threads hand
# results back through spin-waits TSan cannot see (libopenblas is not
# instrumented), so every threaded GEMM would read as a race. Its level-3 split
# never changes a sum, so the bits are the same either way.
# PROTRAIN_TESTING=1: the tests' INI files may use the [testing] section (the
# knobs of their negative controls, tests/README.md); a training run may not.
TEST_ENV := PT_BUILD=$(abspath $(BUILD)) PT_ROOT=$(CURDIR) PT_SAN=$(SAN) OMP_NUM_THREADS=2 $(OMP_ENV) \
            CMOCKA_MESSAGE_OUTPUT=stdout PROTRAIN_TESTING=1 $(if $(filter tsan,$(SAN)),OPENBLAS_NUM_THREADS=1)
test: all ## build and run every test suite (cmocka, shell, pytest, lint, format, fuzz smoke)
	@fail=0; for t in $(TEST_BINS); do \
	  echo "=== $$t"; \
	  $(TEST_ENV) $$t || { echo "FAILED: $$t"; fail=1; }; \
	done; \
	for s in $(wildcard tests/*.sh); do echo "=== $$s"; $(TEST_ENV) bash $$s || { echo "FAILED: $$s"; fail=1; }; done; \
	if [ -z "$(SAN)" ]; then echo "=== pytest host_api/python (the PyTorch host)"; \
	  $(TEST_ENV) $(PY) -m pytest -q -p no:cacheprovider host_api/python/tests || { echo "FAILED: pytest host_api/python"; fail=1; }; fi; \
	if [ -z "$(SAN)" ]; then echo "=== lint (ruff)"; \
	  $(MAKE) --no-print-directory lint || { echo "FAILED: lint"; fail=1; }; \
	  echo "=== format-check (clang-format)"; \
	  $(MAKE) --no-print-directory format-check || { echo "FAILED: format-check"; fail=1; }; fi; \
	if [ -z "$(SAN)" ]; then echo "=== fuzz smoke (2 s per target)"; \
	  $(MAKE) --no-print-directory fuzz FUZZ_SECONDS=2 || { echo "FAILED: fuzz smoke"; fail=1; }; fi; \
	if [ $$fail = 0 ]; then echo "ALL TESTS PASSED ($(BUILD))"; else echo "SOME TESTS FAILED ($(BUILD))"; exit 1; fi

# The default INI, plus the memory timeline of the plan written beside the build.
run: check-deps $(PLUGIN) $(SAMPLE) ## the main job: train the default model with the plugin
	@sed 's|^timeline_file =.*|timeline_file = $(abspath $(BUILD))/run_timeline.svg|' conf/default.ini > $(BUILD)/run.ini
	$(OMP_ENV) $(SAMPLE) --config $(BUILD)/run.ini --plugin $(abspath $(PLUGIN))
	@echo "memory timeline of the plan (predicted, and the measured peak after calibration): $(BUILD)/run_timeline.svg"

# make bench STRICT=1: a missed goal fails the run (benchmarks that have goals).
STRICT ?= 0
bench: all ## benchmarks (STRICT=1: a missed goal fails)
	@for b in $(BENCH_BINS); do echo "=== $$b"; PT_BUILD=$(abspath $(BUILD)) PT_ROOT=$(CURDIR) $(OMP_ENV) PT_BENCH_STRICT=$(STRICT) $$b || exit 1; done
	@echo "=== tests/bench/bench_dist.sh (2 ranks under mpirun)"
	@PT_BUILD=$(abspath $(BUILD)) PT_ROOT=$(CURDIR) PT_BENCH_STRICT=$(STRICT) bash tests/bench/bench_dist.sh || exit 1
	@echo "=== cost-model accuracy, strict (3 round-robin rounds, median of 3 runs per configuration; bar on the sweep where every run profiles itself: median 5%, max 15%)"
	@$(TEST_ENV) PT_ACCURACY_STRICT=1 $(BUILD)/tests/test_plan_accuracy
	@$(MAKE) --no-print-directory bench-nvme

# The disk tier vs pinned memory (docs/nvme.md): step time, I/O hidden, the plan's
# prediction. PT_NVME_DIR: the folder the tier's file goes under (default /var/tmp).
.PHONY: bench-nvme
bench-nvme: $(PLUGIN) $(SAMPLE) ## disk tier ([nvme]) vs pinned states (STRICT=1: a missed goal fails)
	@echo "=== tests/bench/bench_nvme.sh (disk tier vs pinned memory)"
	@PT_BUILD=$(abspath $(BUILD)) PT_ROOT=$(CURDIR) $(OMP_ENV) PT_BENCH_STRICT=$(STRICT) bash tests/bench/bench_nvme.sh

asan: ## the test suite in build-asan (ASan + UBSan)
	$(MAKE) test BUILD=build-asan SAN=asan OPT=-O1 CUDA_TARGET=
tsan: ## the test suite in build-tsan (TSan)
	$(MAKE) test BUILD=build-tsan SAN=tsan OPT=-O1 CUDA_TARGET=

clean: ## remove every build folder
	rm -rf build build-asan build-tsan build-fuzz
