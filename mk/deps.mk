# The Debian packages the build and the tests need: make deps installs them (root)
# or prints the apt-get line; every build step waits for check-deps.

DEB_PKGS := libinih-dev libcmocka-dev libopenblas-dev liblapacke-dev libopenmpi-dev openmpi-bin pkg-config python3-venv \
            clang libclang-rt-14-dev clang-format-19

# ---- dependencies ----
deps: ## install the Debian packages (root) or print the apt-get line
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then echo "deps: all packages present"; \
	elif [ "$$(id -u)" = 0 ]; then echo "deps: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: missing packages; run as root:"; echo "  apt-get install -y$$missing"; exit 1; fi

check-deps: ## install the Debian packages when one is missing (or check PT_DEBROOT)
ifeq ($(PT_DEBROOT),)
	@for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || { $(MAKE) --no-print-directory deps || exit 1; break; }; done
else
	@miss=""; for f in $(DEBROOT_FILES); do [ -e $(DEBROOT)/$$f ] || miss="$$miss $$f"; done; \
	if [ -n "$$miss" ]; then echo "check-deps: PT_DEBROOT=$(DEBROOT) lacks:$$miss"; \
	  echo "  (unpack the .deb files of make gpu-debs there with tests/gpu/debroot.sh)"; exit 1; fi
endif

# make missing-debs: the packages of DEB_PKGS that dpkg says are not installed.
.PHONY: missing-debs
missing-debs: ## list the Debian packages that are not installed
	@for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done
