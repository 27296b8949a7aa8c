# The C build: sources (by wildcard), objects (one rule per layer), the plugin and
# its core archive, the planner CLI, sample_host, the test, test-plugin and bench
# binaries.

CORE_SRCS := host_api/util.c host_api/clock.c $(wildcard plugin/*.c runtime/*/*.c runtime/*/*/*.c gpu/*.c gpu/host/*.c \
              gpu/coll/*.c gpu/coll/mpi/*.c gpu/coll/host/*.c)
CORE_OBJS := $(CORE_SRCS:%.c=$(BUILD)/obj/%.o)
UTIL_OBJ := $(BUILD)/obj/host_api/util.o $(BUILD)/obj/host_api/clock.o
# What a host links to load the plugin: the loader and the shared helpers it uses.
LOADER_OBJ := $(BUILD)/obj/host_api/loader.o $(UTIL_OBJ)
SH_SRCS := $(filter-out sample_host/main.c,$(wildcard sample_host/*.c))
SH_OBJS := $(SH_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_SRCS := $(wildcard tests/unit/test_*.c tests/integ/test_*.c)
TEST_BINS := $(addprefix $(BUILD)/tests/,$(notdir $(TEST_SRCS:.c=)))
TPLUG_SRCS := $(wildcard tests/plugins/*.c)
TPLUG_SOS := $(addprefix $(BUILD)/tests/plugins/,$(notdir $(TPLUG_SRCS:.c=.so)))
BENCH_SRCS := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(addprefix $(BUILD)/bench/,$(notdir $(BENCH_SRCS:.c=)))
CUDA_SRCS := $(wildcard gpu/cuda/*.cu)
CUDA_CSRCS := $(wildcard gpu/cuda/*.c)

PLUGIN := $(BUILD)/protrain_plugin.so
PLAN_CLI := $(if $(wildcard plugin/cli/protrain_plan.c),$(BUILD)/protrain-plan)
CORE_LIB := $(BUILD)/libprotrain_core.a
CUDA_LIB := $(BUILD)/libprotrain_cuda.so
SAMPLE := $(BUILD)/sample_host


# Everything compiled or linked here waits for the packages (see pc in mk/flags.mk).
$(CORE_OBJS) $(SH_OBJS) $(BUILD)/obj/sample_host/main.o $(LOADER_OBJ) $(TEST_BINS) $(TPLUG_SOS) \
  $(BENCH_BINS) $(PLUGIN) $(PLAN_CLI) $(SAMPLE): | check-deps

# ---- objects (one rule per layer: its include paths) ----
OBJ_CC = @mkdir -p $(dir $@); echo "  CC $<"; $(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/host_api/%.o: host_api/%.c
	$(OBJ_CC) $(INC_HOST_API) -fvisibility=hidden
$(BUILD)/obj/gpu/coll/mpi/%.o: gpu/coll/mpi/%.c
	$(OBJ_CC) $(INC_GPU) $(MPI_CFLAGS) -fvisibility=hidden
$(BUILD)/obj/gpu/%.o: gpu/%.c
	$(OBJ_CC) $(INC_GPU) -fvisibility=hidden
$(BUILD)/obj/runtime/%.o: runtime/%.c
	$(OBJ_CC) $(INC_RUNTIME) -fvisibility=hidden
$(BUILD)/obj/plugin/%.o: plugin/%.c
	$(OBJ_CC) $(INC_PLUGIN) -fvisibility=hidden
$(BUILD)/obj/sample_host/%.o: sample_host/%.c
	$(OBJ_CC) $(INC_SAMPLE) $(OMPFLAGS)

# ---- plugin ----
$(CORE_LIB): $(CORE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(PLUGIN): $(CORE_OBJS) plugin/exports.map
	$(CC) -shared -o $@ $(CORE_OBJS) -Wl,--version-script=plugin/exports.map -Wl,-z,defs $(LDFLAGS) $(LIBS)

# ---- planner CLI (no host, no device) ----
$(PLAN_CLI): plugin/cli/protrain_plan.c $(CORE_LIB)
	$(CC) $(CFLAGS) $(INC_PLUGIN) -o $@ $< $(CORE_LIB) $(LDFLAGS) $(LIBS)

# The README's example picture (conf/timeline_example.svg): sample_host's
# default model (conf/default.ini [sample_host]: 6 layers, 192 channels, 6
# heads, vocab 256, batch 8, seq 128, fp32, clipping) on a 0.06 GiB device
# with 1 MiB chunks, so the plan streams chunks and checkpoints.
TIMELINE_EXAMPLE_ARGS := --layers 6 --hidden 192 --heads 6 --vocab 256 --batch 8 --seq 128 --dtype fp32 \
  --max_grad_norm 1 --reserve_gib 0 --headroom_gib 0 --chunk_mib 1 --device_memory_gib 0.06
timeline-example: $(PLAN_CLI) ## write the README's memory timeline picture
	$(PLAN_CLI) $(TIMELINE_EXAMPLE_ARGS) --timeline conf/timeline_example.svg > /dev/null
	@echo "wrote conf/timeline_example.svg"

# ---- sample host ----
$(BUILD)/libsample.a: $(SH_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(SAMPLE): $(BUILD)/obj/sample_host/main.o $(BUILD)/libsample.a $(LOADER_OBJ)
	$(CC) -o $@ $^ $(OMPFLAGS) $(LDFLAGS) -linih $(BLAS_LIBS) -lm -ldl

# ---- tests ----
# The loader objects come first: util.o is then linked once, and the archive
# copy of it is never pulled (listing it after the archive defined it twice).
TEST_LIBS := $(LOADER_OBJ) $(BUILD)/libsample.a $(CORE_LIB)
# Test and bench binaries are compiled in one step from their .c, so -MMD
# writes their header dependencies beside them (<binary>.d, included at the
# end): a change to a shared test header (tests/lib/*.h) or a module header
# rebuilds every binary that includes it.
$(BUILD)/tests/%: tests/unit/%.c $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(OMPFLAGS) $(INC_TESTS) -MMD -MP -MF $@.d -o $@ $< $(TEST_LIBS) $(OMPFLAGS) $(LDFLAGS) -lcmocka $(LIBS)
$(BUILD)/tests/%: tests/integ/%.c $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(OMPFLAGS) $(INC_TESTS) -MMD -MP -MF $@.d -o $@ $< $(TEST_LIBS) $(OMPFLAGS) $(LDFLAGS) -lcmocka $(LIBS)
# The NCCL transport's source built against the simulated NCCL / CUDA runtime
# (tests/nccl_sim/: its headers and nccl_sim.c), so it runs without a GPU.
NCCL_SIM_SRCS := tests/unit/test_nccl_sim.c tests/nccl_sim/nccl_sim.c gpu/coll/nccl/coll_nccl.c
$(BUILD)/tests/test_nccl_sim: $(NCCL_SIM_SRCS) gpu/coll/nccl/rank_sum.h gpu/coll/coll_nccl.h gpu/coll/coll.h \
                              $(wildcard tests/nccl_sim/*.h) $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_TESTS) -Itests/nccl_sim -Igpu/coll/nccl -o $@ $(NCCL_SIM_SRCS) $(TEST_LIBS) \
	  $(LDFLAGS) -lcmocka $(LIBS)
$(BUILD)/tests/plugins/%.so: tests/plugins/%.c host_api/protrain.h gpu/gpu.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_TESTS) -shared -o $@ $< $(LDFLAGS)
$(BUILD)/bench/%: tests/bench/%.c $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(OMPFLAGS) $(INC_TESTS) -MMD -MP -MF $@.d -o $@ $< $(TEST_LIBS) $(OMPFLAGS) $(LDFLAGS) $(LIBS)
