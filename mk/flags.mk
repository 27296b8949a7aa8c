# Compiler flags, installed packages' flags (pkg-config), the layers' include
# paths and the sanitizer modes (SAN=asan|tsan|fuzz).

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
