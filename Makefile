# protrain — top-level build.
#   make          plugin, cuda backend (when nvcc exists), sample_host, tests
#   make test     build and run every test suite (cmocka), non-zero on failure
#   make test-gpu the CUDA suite on a GPU machine (says so and exits 0 without one)
#   make run      the main job: train the default model with the plugin
#   make bench    benchmarks (make bench-gpu: sample_host throughput on a GPU)
#   make asan / make tsan   sanitizer builds running the same tests
#   make fuzz     libFuzzer targets (clang) for FUZZ_SECONDS each
#   make deps     install the Debian packages (root) or print the apt-get line
#
# Sources are picked up by wildcard so a new file needs no Makefile edit:
#   plugin/*.c runtime/*/*.c gpu/*.c gpu/host/*.c gpu/coll/*.c gpu/coll/mpi/*.c
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

DEB_PKGS := libinih-dev libcmocka-dev libopenblas-dev liblapacke-dev libopenmpi-dev openmpi-bin pkg-config python3-venv \
            clang libclang-rt-14-dev

WARN := -Wall -Wextra -Werror
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE $(OPT) -g -fPIC -fno-math-errno -pthread $(WARN)

# Flags of installed packages come from pkg-config, and only when a recipe runs:
# these are recursive (=) variables, and every object and link waits for
# check-deps (order-only prerequisite below), so on a fresh machine the first
# `make test` installs the packages before anything asks pkg-config about them.
# A package pkg-config does not know stops the build with its name, never with
# an empty flag and a missing header further on.
PKG_CONFIG ?= pkg-config
pc = $(if $(shell $(PKG_CONFIG) --exists $(1) && echo y),$(shell $(PKG_CONFIG) $(2) $(1)),$(error pkg-config does not know $(1): install the Debian packages with 'make deps' (as root)))
BLAS_CFLAGS = $(call pc,openblas,--cflags)
BLAS_LIBS = $(call pc,openblas,--libs)
MPI_CFLAGS = $(call pc,ompi-c,--cflags)
MPI_LIBS = $(call pc,ompi-c,--libs)

# Layers: each folder compiles with the include paths of what it may use, so a
# wrong-way include (runtime -> plugin, sample_host -> runtime, ...) does not
# compile. Inside runtime/, subsystems include each other as "store/store.h",
# "planner/planner.h", ... and tests/check_layers.sh (run by make test) checks
# that only those interface headers cross a subsystem boundary.
INC_HOST_API := -Ihost_api
INC_GPU      := -Ihost_api -Igpu
INC_RUNTIME  := -Ihost_api -Igpu -Iruntime
INC_PLUGIN   := -Ihost_api -Igpu -Iruntime -Iplugin
INC_SAMPLE   := -Ihost_api
INC_TESTS    := -Ihost_api -Igpu -Iruntime -Iplugin -Isample_host -Itests/lib
ifeq ($(SAN),tsan)
  # libgomp is not tsan-instrumented: build the OpenMP loops serial under tsan.
  OMPFLAGS :=
  SANFLAGS := -fsanitize=thread -Wno-unknown-pragmas
else ifeq ($(SAN),fuzz)
  # libFuzzer targets (clang): coverage instrumentation plus ASan+UBSan in every
  # object; OpenMP off (clang's runtime is not installed).
  OMPFLAGS :=
  SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=undefined -Wno-unknown-pragmas
else ifeq ($(SAN),asan)
  OMPFLAGS := -fopenmp
  SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
  OMPFLAGS := -fopenmp
  SANFLAGS :=
endif
CFLAGS = $(CFLAGS_BASE) $(BLAS_CFLAGS) $(SANFLAGS) $(EXTRA_CFLAGS)
LDFLAGS := $(SANFLAGS) -pthread
# MPI: gpu/coll/mpi/ only compiles with its headers; whatever links the core links libmpi.
LIBS = -linih $(BLAS_LIBS) -llapacke -lm -ldl $(MPI_LIBS)

# ---- packages unpacked into a folder instead of installed (PT_DEBROOT) ----
# A machine that cannot install packages (no network: the GPU machines) gets them
# as .deb files fetched elsewhere (make gpu-debs, on a Debian machine with apt, into
# $(BUILD)/debs) and unpacked with dpkg -x into a folder (tests/gpu/debroot.sh).
# make PT_DEBROOT=<folder> then looks for the files the build needs there instead of
# asking dpkg, and points everything at that folder: pkg-config reads only its .pc
# files, and its sysroot puts the folder in front of every -I and -L they give; the
# compiler finds the headers and libraries named without pkg-config (-linih,
# -lcmocka, -llapacke) through C_INCLUDE_PATH (system headers, as /usr/include's
# are: -Werror does not reach into them) and -L in LDFLAGS (ahead of the system's
# folders, where LIBRARY_PATH would come after them); programs load the shared
# libraries through LD_LIBRARY_PATH; mpirun comes from the folder's PATH, and
# OPAL_PREFIX / OPAL_SYSCONFDIR make Open MPI read its components, help texts and
# defaults there (its paths are compiled in as /usr and /etc/openmpi).
# GPU_DEBS: the build's packages and the libraries they load that a CUDA/PyTorch
# image may lack (what every Debian or Ubuntu image with gcc has: libc6, libgcc-s1,
# libstdc++6, libgomp1, libatomic1, zlib1g, libuuid1, is left out). libudev1 (which
# hwloc, hence libmpi, loads) travels too, but debroot.sh unpacks it only where the
# machine has no libudev.so.1: the system's own copy is newer.
GPU_DEBS := libinih1 libinih-dev libinireader0 libcmocka0 libcmocka-dev \
  libopenblas0-pthread libopenblas-pthread-dev libopenblas0 libopenblas-dev libgfortran5 libquadmath0 \
  liblapacke liblapacke-dev libtmglib3 \
  libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 \
  libevent-pthreads-2.1-7 libmunge2 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 \
  libnl-3-200 libnl-route-3-200 libnuma1 ibverbs-providers libudev1 \
  pkg-config pkgconf pkgconf-bin libpkgconf3
# Files whose absence means the folder cannot build (checked by check-deps).
DEBROOT_FILES := usr/include/ini.h usr/include/cmocka.h usr/include/lapacke.h \
  usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
  usr/lib/x86_64-linux-gnu/libinih.so usr/lib/x86_64-linux-gnu/libcmocka.so \
  usr/lib/x86_64-linux-gnu/liblapacke.so usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so \
  usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so usr/bin/mpirun usr/bin/pkg-config
ifneq ($(PT_DEBROOT),)
  DEBROOT := $(abspath $(PT_DEBROOT))
  DEB_ML := $(DEBROOT)/usr/lib/x86_64-linux-gnu
  # (libnl ships in /lib, libpsm_infinipath in its own folder behind an alternative)
  DEB_LIBPATH := $(DEB_ML):$(DEB_ML)/openblas-pthread:$(DEB_ML)/openmpi/lib:$(DEBROOT)/lib/x86_64-linux-gnu:$(DEBROOT)/usr/lib/libpsm1
  # (the environment written out: make 4.3 runs $(shell) without the exports below)
  PKG_CONFIG := PKG_CONFIG_LIBDIR=$(DEB_ML)/pkgconfig:$(DEB_ML)/openblas-pthread/pkgconfig \
                PKG_CONFIG_SYSROOT_DIR=$(DEBROOT) LD_LIBRARY_PATH=$(DEB_LIBPATH) $(DEBROOT)/usr/bin/pkg-config
  export C_INCLUDE_PATH := $(DEBROOT)/usr/include:$(DEBROOT)/usr/include/x86_64-linux-gnu$(if $(C_INCLUDE_PATH),:$(C_INCLUDE_PATH))
  LDFLAGS += $(addprefix -L,$(subst :, ,$(DEB_LIBPATH)))
  export LD_LIBRARY_PATH := $(DEB_LIBPATH)$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))
  export PATH := $(DEBROOT)/usr/bin:$(PATH)
  export OPAL_PREFIX := $(DEBROOT)/usr
  export OPAL_SYSCONFDIR := $(DEBROOT)/etc/openmpi
endif

CORE_SRCS := host_api/util.c host_api/clock.c $(wildcard plugin/*.c runtime/*/*.c gpu/*.c gpu/host/*.c gpu/coll/*.c gpu/coll/mpi/*.c gpu/coll/host/*.c)
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

SAMPLE_CUDA := $(BUILD)/libsample_cuda.so
# The NCCL transport (gpu/coll/nccl/): its own .so, built when the toolkit ships nccl.h.
NCCL_LIB := $(BUILD)/libprotrain_nccl.so
CUDA_LIBDIR := $(abspath $(dir $(NVCC))../lib64)
CUDA_INCDIR := $(abspath $(dir $(NVCC))../include)
NCCL_HDR := $(if $(NVCC),$(wildcard $(CUDA_INCDIR)/nccl.h))
ifneq ($(NVCC),)
  CUDA_TARGET := $(CUDA_LIB) $(SAMPLE_CUDA) $(if $(NCCL_HDR),$(NCCL_LIB),nccl-notice)
else
  CUDA_TARGET := cuda-notice
endif

.PHONY: all test test-gpu bench-gpu fuzz fuzz-build run bench asan tsan deps check-deps clean cuda-notice nccl-notice \
        timeline-example
all: check-deps $(PLUGIN) $(CUDA_TARGET) $(SAMPLE) $(PLAN_CLI) $(TEST_BINS) $(TPLUG_SOS) $(BENCH_BINS)

# ---- dependencies ----
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then echo "deps: all packages present"; \
	elif [ "$$(id -u)" = 0 ]; then echo "deps: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: missing packages; run as root:"; echo "  apt-get install -y$$missing"; exit 1; fi

check-deps:
ifeq ($(PT_DEBROOT),)
	@for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || { $(MAKE) --no-print-directory deps || exit 1; break; }; done
else
	@miss=""; for f in $(DEBROOT_FILES); do [ -e $(DEBROOT)/$$f ] || miss="$$miss $$f"; done; \
	if [ -n "$$miss" ]; then echo "check-deps: PT_DEBROOT=$(DEBROOT) lacks:$$miss"; \
	  echo "  (unpack the .deb files of make gpu-debs there with tests/gpu/debroot.sh)"; exit 1; fi
endif

# Everything compiled or linked here waits for the packages (see pc above).
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

# ---- cuda backend (separate .so, dlopened by the plugin) ----
# sm_80 and sm_90 machine code, plus sm_90 PTX that the driver compiles for newer GPUs.
# -fmad=false: no a*b+c contraction, so the kernels shared with the CPU give its bits.
CUDA_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -O2 -std=c++17 -fmad=false
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/obj/%.cu.o) $(CUDA_CSRCS:%.c=$(BUILD)/obj/%.o) $(UTIL_OBJ)
# (backend.cu includes gpu/cuda/*.cuh and the shared element bodies)
$(BUILD)/obj/%.cu.o: %.cu $(wildcard gpu/cuda/*.cuh) gpu/kernels_hd.h gpu/gpu.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror \
	  $(INC_GPU) -c $< -o $@
# cuBLAS and cuSOLVER (OSFT's and REKLS's GEMMs, SVD and eigendecompositions) from the
# toolkit's lib64 (rpath).
$(CUDA_LIB): $(CUDA_OBJS)
	$(NVCC) -shared $(CUDA_ARCH) -o $@ $(CUDA_OBJS) -Xlinker --version-script=gpu/cuda/exports.map \
	  -Xlinker -rpath,$(CUDA_LIBDIR) -L$(CUDA_LIBDIR) -lcublas -lcusolver -cudart static
cuda-notice:
	@echo "notice: nvcc not found; skipping $(CUDA_LIB) (the plugin runs on the host backend)"
	@echo "notice: nvcc not found; skipping $(NCCL_LIB) ([dist] backend = nccl is unavailable)"
	@echo "notice: nvcc not found; skipping $(SAMPLE_CUDA) (sample_host --device cuda is unavailable)"

# ---- the NCCL transport (separate .so, dlopened by the collectives front when picked) ----
# Plain C (gpu/coll/nccl/*.c, with nccl.h and the CUDA runtime's C header) plus its one
# kernel (gpu/coll/nccl/cuda/*.cu, the rank-order sum); libnccl from the toolkit's lib64
# (rpath), the CUDA runtime linked statically like the backend's.
NCCL_SRCS := $(wildcard gpu/coll/nccl/*.c)
NCCL_CU_SRCS := $(wildcard gpu/coll/nccl/cuda/*.cu)
NCCL_OBJS := $(NCCL_SRCS:%.c=$(BUILD)/obj/%.o) $(NCCL_CU_SRCS:%.cu=$(BUILD)/obj/%.cu.o) $(UTIL_OBJ)
$(BUILD)/obj/gpu/coll/nccl/%.o: gpu/coll/nccl/%.c
	$(OBJ_CC) $(INC_GPU) -I$(CUDA_INCDIR) -fvisibility=hidden
$(BUILD)/obj/gpu/coll/nccl/cuda/%.cu.o: gpu/coll/nccl/cuda/%.cu gpu/coll/nccl/rank_sum.h gpu/coll/coll.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror \
	  $(INC_GPU) -c $< -o $@
$(NCCL_LIB): $(NCCL_OBJS) gpu/coll/nccl/exports.map
	$(NVCC) -shared $(CUDA_ARCH) -o $@ $(NCCL_OBJS) -Xlinker --version-script=gpu/coll/nccl/exports.map \
	  -Xlinker -rpath,$(CUDA_LIBDIR) -L$(CUDA_LIBDIR) -lnccl -cudart static
nccl-notice:
	@echo "notice: $(CUDA_INCDIR)/nccl.h not found; skipping $(NCCL_LIB) ([dist] backend = nccl is unavailable)"

# ---- sample_host's CUDA layers (separate .so, dlopened by sample_host --device cuda) ----
# -fmad=false: a*b+c rounds twice, as in the CPU layers (sh_elem.h). cuBLAS from the
# toolkit's lib64 (rpath), the runtime linked statically.
SH_CUDA_SRCS := $(wildcard sample_host/cuda/*.cu)
SH_CUDA_OBJS := $(SH_CUDA_SRCS:%.cu=$(BUILD)/obj/%.cu.o)
SH_CUDA_HDRS := $(wildcard sample_host/cuda/*.cuh) sample_host/sh_cuda.h sample_host/sh_ops.h \
                sample_host/sh_elem.h
$(BUILD)/obj/sample_host/cuda/%.cu.o: sample_host/cuda/%.cu $(SH_CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -fmad=false $(CUDA_ARCH) \
	  -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror $(INC_SAMPLE) -Isample_host -c $< -o $@
$(SAMPLE_CUDA): $(SH_CUDA_OBJS) sample_host/cuda/exports.map
	$(NVCC) -shared $(CUDA_ARCH) -o $@ $(SH_CUDA_OBJS) \
	  -Xlinker --version-script=sample_host/cuda/exports.map -Xlinker -rpath,$(CUDA_LIBDIR) \
	  -L$(CUDA_LIBDIR) -lcublas -cudart static

# ---- planner CLI (no host, no device) ----
$(PLAN_CLI): plugin/cli/protrain_plan.c $(CORE_LIB)
	$(CC) $(CFLAGS) $(INC_PLUGIN) -o $@ $< $(CORE_LIB) $(LDFLAGS) $(LIBS)

# The README's example picture (conf/timeline_example.svg): sample_host's
# default model (conf/default.ini [sample_host]: 6 layers, 192 channels, 6
# heads, vocab 256, batch 8, seq 128, fp32, clipping) on a 0.06 GiB device
# with 1 MiB chunks, so the plan streams chunks and checkpoints.
TIMELINE_EXAMPLE_ARGS := --layers 6 --hidden 192 --heads 6 --vocab 256 --batch 8 --seq 128 --dtype fp32 \
  --max_grad_norm 1 --reserve_gib 0 --headroom_gib 0 --chunk_mib 1 --device_memory_gib 0.06
timeline-example: $(PLAN_CLI)
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
test: all
	@fail=0; for t in $(TEST_BINS); do \
	  echo "=== $$t"; \
	  $(TEST_ENV) $$t || { echo "FAILED: $$t"; fail=1; }; \
	done; \
	for s in $(wildcard tests/*.sh); do echo "=== $$s"; $(TEST_ENV) bash $$s || { echo "FAILED: $$s"; fail=1; }; done; \
	if [ -z "$(SAN)" ]; then echo "=== pytest host_api/python (the PyTorch host)"; \
	  $(TEST_ENV) $(PY) -m pytest -q -p no:cacheprovider host_api/python/tests || { echo "FAILED: pytest host_api/python"; fail=1; }; fi; \
	if [ -z "$(SAN)" ]; then echo "=== fuzz smoke (2 s per target)"; \
	  $(MAKE) --no-print-directory fuzz FUZZ_SECONDS=2 || { echo "FAILED: fuzz smoke"; fail=1; }; fi; \
	if [ $$fail = 0 ]; then echo "ALL TESTS PASSED ($(BUILD))"; else echo "SOME TESTS FAILED ($(BUILD))"; exit 1; fi

# ---- the PyTorch host (host_api/python): its Python environment ----
# build/venv is created when build/venv/bin/python is missing (a symlink to an
# existing environment counts as present), with the pinned packages of
# host_api/python/requirements.txt from the package registry. One environment
# for every build folder (the sanitizer builds run no Python: the interpreter is
# not instrumented), so it lives in build/ whatever BUILD is.
PY_VENV := build/venv
PY := $(PY_VENV)/bin/python
$(PY):
	python3 -m venv $(PY_VENV)
	$(PY) -m pip install -r host_api/python/requirements.txt
test: $(if $(SAN),,$(PY)) $(PLUGIN)
# The CUDAPluggableAllocator shim of the PyTorch host (plain C: no CUDA or torch
# headers; torch loads it with ctypes and calls it for every CUDA allocation).
TORCH_SHIM := $(BUILD)/pt_torch_alloc.so
$(TORCH_SHIM): host_api/python/shim/pt_torch_alloc.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -shared -o $@ $<
all: $(TORCH_SHIM)
test: $(TORCH_SHIM)
# make bench: tokens/s through the PyTorch adapter vs plain PyTorch on the CPU
.PHONY: bench-torch
bench-torch: $(PY) $(PLUGIN)
	@echo "=== host_api/python/bench/bench_torch.py (PyTorch adapter vs plain PyTorch)"
	@PT_BUILD=$(abspath $(BUILD)) $(OMP_ENV) PT_BENCH_STRICT=$(STRICT) $(PY) host_api/python/bench/bench_torch.py
bench: bench-torch

# The GPU suite (tests/gpu/run.sh): says so and exits 0 on a machine without a GPU.
test-gpu: all
	@PT_BUILD=$(abspath $(BUILD)) bash tests/gpu/run.sh

# GPU throughput (tests/gpu/bench_cuda.sh): says so and exits 0 without a GPU.
bench-gpu: all
	@PT_BUILD=$(abspath $(BUILD)) PT_BENCH_STRICT=$(STRICT) bash tests/gpu/bench_cuda.sh

# The default INI, plus the memory timeline of the plan written beside the build.
run: check-deps $(PLUGIN) $(SAMPLE)
	@sed 's|^timeline_file =.*|timeline_file = $(abspath $(BUILD))/run_timeline.svg|' conf/default.ini > $(BUILD)/run.ini
	$(OMP_ENV) $(SAMPLE) --config $(BUILD)/run.ini --plugin $(abspath $(PLUGIN))
	@echo "memory timeline of the plan (predicted, and the measured peak after calibration): $(BUILD)/run_timeline.svg"

# make bench STRICT=1: a missed goal fails the run (benchmarks that have goals).
STRICT ?= 0
bench: all
	@for b in $(BENCH_BINS); do echo "=== $$b"; PT_BUILD=$(abspath $(BUILD)) PT_ROOT=$(CURDIR) $(OMP_ENV) PT_BENCH_STRICT=$(STRICT) $$b || exit 1; done
	@echo "=== tests/bench/bench_dist.sh (2 ranks under mpirun)"
	@PT_BUILD=$(abspath $(BUILD)) PT_ROOT=$(CURDIR) PT_BENCH_STRICT=$(STRICT) bash tests/bench/bench_dist.sh || exit 1
	@echo "=== cost-model accuracy, strict (3 round-robin rounds, median of 3 runs per configuration; bar on the sweep where every run profiles itself: median 5%, max 15%)"
	@$(TEST_ENV) PT_ACCURACY_STRICT=1 $(BUILD)/tests/test_plan_accuracy

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
fuzz-build:
	@command -v clang >/dev/null || { echo "fuzz: clang is not installed (make deps installs it)"; exit 1; }
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_DIR) CC=clang SAN=fuzz CUDA_TARGET= \
	  $(addprefix $(FUZZ_DIR)/fuzz/,$(FUZZ_NAMES))
fuzz: fuzz-build
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

asan:
	$(MAKE) test BUILD=build-asan SAN=asan OPT=-O1 CUDA_TARGET=
tsan:
	$(MAKE) test BUILD=build-tsan SAN=tsan OPT=-O1 CUDA_TARGET=

clean:
	rm -rf build build-asan build-tsan build-fuzz

# ---- install like a library: make install PREFIX=... / make uninstall PREFIX=... ----
# Installed: the plugin and the CUDA libraries (when built) in LIBDIR; protrain.h (it
# needs only <stdint.h>) in INCDIR; the loader as libprotrain_loader.a with a
# protrain.pc (pkg-config: -I for the header, the archive and -ldl); protrain-plan and
# sample_host in BINDIR; the INI files in DATADIR. The loader and sample_host are
# rebuilt for the install with LIBDIR compiled in (PT_INSTALL_LIBDIR), so a host
# finds the installed plugin by short name with no environment; sample_host also gets
# LIBDIR as its run path, for libsample_cuda.so.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCDIR ?= $(PREFIX)/include
BINDIR ?= $(PREFIX)/bin
DATADIR ?= $(PREFIX)/share/protrain
INST := $(BUILD)/install
INST_LIBS := $(PLUGIN) $(wildcard $(CUDA_LIB) $(SAMPLE_CUDA) $(NCCL_LIB))
INST_FILES := $(notdir $(INST_LIBS)) libprotrain_loader.a pkgconfig/protrain.pc
.PHONY: install uninstall install-build
install-build: check-deps $(PLUGIN) $(CUDA_TARGET) $(SAMPLE) $(PLAN_CLI)
	@mkdir -p $(INST)
	$(CC) $(CFLAGS) $(INC_HOST_API) -fvisibility=hidden -DPT_INSTALL_LIBDIR='"$(abspath $(LIBDIR))"' \
	  -c host_api/loader.c -o $(INST)/loader.o
	rm -f $(INST)/libprotrain_loader.a && ar rcs $(INST)/libprotrain_loader.a $(INST)/loader.o $(UTIL_OBJ)
	$(CC) -o $(INST)/sample_host $(BUILD)/obj/sample_host/main.o $(BUILD)/libsample.a \
	  $(INST)/loader.o $(UTIL_OBJ) $(OMPFLAGS) $(LDFLAGS) -Wl,-rpath,$(abspath $(LIBDIR)) \
	  -linih $(BLAS_LIBS) -lm -ldl
	printf 'prefix=%s\nlibdir=%s\nincludedir=%s\n\nName: protrain\nDescription: %s\nVersion: 1\nCflags: -I$${includedir}\nLibs: -L$${libdir} -lprotrain_loader -ldl\n' \
	  '$(abspath $(PREFIX))' '$(abspath $(LIBDIR))' '$(abspath $(INCDIR))' \
	  'ProTrain plugin loader (pt_plugin_load) and ABI header' > $(INST)/protrain.pc
install: install-build
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(DATADIR)
	install -m 755 $(INST_LIBS) $(DESTDIR)$(LIBDIR)/
	install -m 644 $(INST)/libprotrain_loader.a $(DESTDIR)$(LIBDIR)/
	install -m 644 $(INST)/protrain.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	install -m 644 host_api/protrain.h $(DESTDIR)$(INCDIR)/
	install -m 755 $(INST)/sample_host $(PLAN_CLI) $(DESTDIR)$(BINDIR)/
	install -m 644 conf/*.ini $(DESTDIR)$(DATADIR)/
uninstall:
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,$(INST_FILES) libprotrain_cuda.so libsample_cuda.so libprotrain_nccl.so) \
	  $(DESTDIR)$(INCDIR)/protrain.h $(DESTDIR)$(BINDIR)/sample_host $(DESTDIR)$(BINDIR)/protrain-plan \
	  $(addprefix $(DESTDIR)$(DATADIR)/,$(notdir $(wildcard conf/*.ini)))
	-rmdir $(DESTDIR)$(DATADIR) $(DESTDIR)$(LIBDIR)/pkgconfig 2>/dev/null

# ---- GPU day: the peers of make bench-peers (tests/bench/peers/) ----
# make bench-peers: protrain, plain PyTorch, FSDP2 offload and DeepSpeed ZeRO-2/3
# offload on one Llama at one memory cap (a CPU rehearsal without a GPU).
# make peers-wheels: DeepSpeed (pure-Python wheel from its sdist, its ops compiled
# just in time on the GPU machine) and the small packages it needs that the GPU
# image lacks, as wheels for Python $(PEERS_PYVER), into $(BUILD)/wheels; they
# travel with the working tree and bench_peers.py installs them into a temp folder.
# build/venv where the PyTorch host's target made it, else the machine's python3
# (the GPU machines' python3 holds torch and transformers)
PEERS_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
PEERS_PYVER ?= 3.12
DS_VERSION ?= 0.19.8
PEERS_DEPS ?= hjson pydantic
PEERS_BUDGET ?= 320
.PHONY: bench-peers peers-wheels
bench-peers:
	@PT_BUILD=$(abspath $(BUILD)) PYTHONUNBUFFERED=1 $(PEERS_PY) tests/bench/peers/bench_peers.py \
	  --out $(BUILD)/peers --budget $(PEERS_BUDGET)
peers-wheels:
	@mkdir -p $(BUILD)/wheels
	DS_BUILD_OPS=0 $(PEERS_PY) -m pip wheel --no-deps --no-build-isolation --no-binary deepspeed \
	  -w $(BUILD)/wheels deepspeed==$(DS_VERSION)
	$(PEERS_PY) -m pip download --only-binary=:all: --python-version $(PEERS_PYVER) \
	  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	  -d $(BUILD)/wheels $(PEERS_DEPS)
	@ls -l $(BUILD)/wheels/*.whl; du -ch $(BUILD)/wheels/*.whl | tail -1

# make gpu-debs: the .deb files of GPU_DEBS (see PT_DEBROOT above) for this machine's
# Debian release into $(BUILD)/debs, to travel with the tree to a machine that has no
# network; make missing-debs: the packages of DEB_PKGS that dpkg says are not installed.
.PHONY: gpu-debs missing-debs
gpu-debs:
	@mkdir -p $(BUILD)/debs && rm -f $(BUILD)/debs/*.deb
	cd $(BUILD)/debs && { apt-get download $(GPU_DEBS) || { apt-get update -qq && apt-get download $(GPU_DEBS); }; }
	@ls $(BUILD)/debs/*.deb | wc -l; du -ch $(BUILD)/debs/*.deb | tail -1
missing-debs:
	@for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done

-include $(shell find $(BUILD)/obj $(BUILD)/tests $(BUILD)/bench -maxdepth 8 -name '*.d' 2>/dev/null)
