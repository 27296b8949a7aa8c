# ---- fuzzing (libFuzzer, clang): tests/fuzz/fuzz_*.c ----
# The whole tree is rebuilt with clang's coverage instrumentation + ASan/UBSan in
# build-fuzz/; each target then runs for FUZZ_SECONDS on a scratch corpus seeded
# from tests/fuzz/corpus/<target>/. make test runs a short smoke (FUZZ_SECONDS=2).
FUZZ_SECONDS ?= 60
FUZZ_DIR := build-fuzz
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(notdir $(FUZZ_SRCS:.c=))
$(BUILD)/fuzz/%: tests/fuzz/%.c tests/fuzz/fuzz_file.h $(BUILD)/libsample.a $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer $(INC_TESTS) -o $@ $< $(BUILD)/libsample.a $(CORE_LIB) \
	  $(LDFLAGS) -fsanitize=fuzzer $(LIBS)
fuzz-build: ## build the fuzz targets in build-fuzz
	@command -v clang >/dev/null || { echo "fuzz: clang is not installed (make deps installs it)"; exit 1; }
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_DIR) CC=clang SAN=fuzz CUDA_TARGET= \
	  $(addprefix $(FUZZ_DIR)/fuzz/,$(FUZZ_NAMES))
fuzz: fuzz-build ## libFuzzer targets (clang) for FUZZ_SECONDS each
	@fail=0; total=0; for t in $(FUZZ_NAMES); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/artifacts; \
	  $(FUZZ_DIR)/fuzz/$$t $(FUZZ_DIR)/corpus/$$t tests/fuzz/corpus/$$t -max_total_time=$(FUZZ_SECONDS) \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t- -rss_limit_mb=2048 \
	    > $(FUZZ_DIR)/$$t.log 2>&1; rc=$$?; \
	  n=$$(sed -n 's/^stat::number_of_executed_units: *//p' $(FUZZ_DIR)/$$t.log); \
	  total=$$((total + $${n:-0})); \
	  if [ $$rc = 0 ]; then echo "fuzz $$t: $${n:-?} execs in $(FUZZ_SECONDS) s, 0 crashes"; \
	  else echo "fuzz $$t: FAILED (exit $$rc) after $${n:-?} execs; see $(FUZZ_DIR)/$$t.log"; \
	    grep -m3 -E "ERROR|SUMMARY|Test unit written" $(FUZZ_DIR)/$$t.log; fail=1; fi; \
	done; echo "fuzz: $$total execs in all"; exit $$fail
