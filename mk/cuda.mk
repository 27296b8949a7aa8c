# The CUDA libraries, built when nvcc exists: the backend, the NCCL transport and
# sample_host's CUDA layers.

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
