# GPU-machine logistics: the packages unpacked into a folder on a machine without
# network (PT_DEBROOT, make gpu-debs), the GPU suite and throughput (test-gpu,
# bench-gpu) and the peers' benchmark with its wheels (bench-peers, peers-wheels).

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

# The GPU suite (tests/gpu/run.sh): says so and exits 0 on a machine without a GPU.
test-gpu: all ## the CUDA suite on a GPU machine (says so and exits 0 without one)
	@PT_BUILD=$(abspath $(BUILD)) bash tests/gpu/run.sh

# GPU throughput (tests/gpu/bench_cuda.sh): says so and exits 0 without a GPU.
bench-gpu: all ## sample_host throughput on a GPU (exits 0 without one)
	@PT_BUILD=$(abspath $(BUILD)) PT_BENCH_STRICT=$(STRICT) bash tests/gpu/bench_cuda.sh

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
bench-peers: ## protrain vs PyTorch, FSDP2, DeepSpeed offload on one Llama
	@PT_BUILD=$(abspath $(BUILD)) PYTHONUNBUFFERED=1 $(PEERS_PY) tests/bench/peers/bench_peers.py \
	  --out $(BUILD)/peers --budget $(PEERS_BUDGET)
peers-wheels: ## download the wheels bench-peers installs on the GPU machine
	@mkdir -p $(BUILD)/wheels
	DS_BUILD_OPS=0 $(PEERS_PY) -m pip wheel --no-deps --no-build-isolation --no-binary deepspeed \
	  -w $(BUILD)/wheels deepspeed==$(DS_VERSION)
	$(PEERS_PY) -m pip download --only-binary=:all: --python-version $(PEERS_PYVER) \
	  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	  -d $(BUILD)/wheels $(PEERS_DEPS)
	@ls -l $(BUILD)/wheels/*.whl; du -ch $(BUILD)/wheels/*.whl | tail -1

# make gpu-debs: the .deb files of GPU_DEBS (see PT_DEBROOT above) for this machine's
# Debian release into $(BUILD)/debs, to travel with the tree to a machine that has no
# network.
.PHONY: gpu-debs
gpu-debs: ## fetch the .deb files a GPU machine without network unpacks
	@mkdir -p $(BUILD)/debs && rm -f $(BUILD)/debs/*.deb
	cd $(BUILD)/debs && { apt-get download $(GPU_DEBS) || { apt-get update -qq && apt-get download $(GPU_DEBS); }; }
	@ls $(BUILD)/debs/*.deb | wc -l; du -ch $(BUILD)/debs/*.deb | tail -1
