# Style checks: make lint (ruff over the Python host and the test/bench scripts,
# ruff.toml; make test runs it) and make format-check (clang-format over the C
# and CUDA sources, .clang-format; make test runs it too). make format rewrites
# the C sources in place.

# ruff at the version pinned in host_api/python/requirements.txt, installed into
# build/venv when missing (an environment made before the pin has none).
RUFF := $(PY_VENV)/bin/ruff
$(RUFF): | $(PY)
	$(PY) -m pip install "$$(grep -E '^ruff==' host_api/python/requirements.txt)"
.PHONY: lint
lint: $(RUFF) ## ruff over host_api/python and the test/bench scripts (ruff.toml)
	$(RUFF) check --no-cache .

# clang-format 16 or newer (.clang-format leaves trailing comments where they
# are, an option 16 added): clang-format-19 when installed, else clang-format.
CLANG_FORMAT ?= $(shell command -v clang-format-19 2>/dev/null || command -v clang-format 2>/dev/null)
FORMAT_SRCS = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null)
.PHONY: format-check format format-tool
format-tool:
	@[ -n "$(CLANG_FORMAT)" ] || { echo "format: clang-format is not installed (Debian: apt-get install clang-format-19)"; exit 1; }; \
	v=$$($(CLANG_FORMAT) --version | sed -n 's/.*version \([0-9]*\).*/\1/p'); \
	[ "$${v:-0}" -ge 16 ] || { echo "format: $(CLANG_FORMAT) is version $$v; .clang-format needs 16 or newer (Debian: apt-get install clang-format-19)"; exit 1; }
format-check: format-tool ## list the C/CUDA files clang-format would change (.clang-format)
	@n=0; lines=0; for f in $(FORMAT_SRCS); do \
	  d=$$($(CLANG_FORMAT) --style=file "$$f" | diff "$$f" - | grep -c '^<'); \
	  if [ "$$d" != 0 ]; then echo "  $$f: $$d lines"; n=$$((n + 1)); lines=$$((lines + d)); fi; \
	done; \
	echo "format-check: $$n of $(words $(FORMAT_SRCS)) files, $$lines lines would change (make format)"; \
	[ $$n = 0 ]
format: format-tool ## rewrite the C/CUDA sources with clang-format (.clang-format)
	$(CLANG_FORMAT) -i --style=file $(FORMAT_SRCS)
