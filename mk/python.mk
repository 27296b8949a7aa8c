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
# The real trainers the tests drive (TRL's SFTTrainer, axolotl's CLI):
# host_api/python/requirements-trainers.txt, every version pinned, installed
# without dependencies on top of requirements.txt (axolotl declares Python 3.12
# and other torch/transformers pins; docs/trainers.md), again when the file changes.
PY_TRAINERS := $(PY_VENV)/.requirements-trainers
$(PY_TRAINERS): host_api/python/requirements-trainers.txt | $(PY)
	$(PY) -m pip install -q --no-deps --ignore-requires-python -r $<
	cp $< $@
test: $(if $(SAN),,$(PY_TRAINERS))
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
bench-torch: $(PY) $(PLUGIN) ## tokens/s of the PyTorch adapter vs plain PyTorch (CPU)
	@echo "=== host_api/python/bench/bench_torch.py (PyTorch adapter vs plain PyTorch)"
	@PT_BUILD=$(abspath $(BUILD)) $(OMP_ENV) PT_BENCH_STRICT=$(STRICT) $(PY) host_api/python/bench/bench_torch.py
bench: bench-torch
