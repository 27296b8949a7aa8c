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
install-build: check-deps $(PLUGIN) $(CUDA_TARGET) $(SAMPLE) $(PLAN_CLI) ## build what make install copies (no copying)
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
install: install-build ## install like a library (PREFIX=..., DESTDIR=...)
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(DATADIR)
	install -m 755 $(INST_LIBS) $(DESTDIR)$(LIBDIR)/
	install -m 644 $(INST)/libprotrain_loader.a $(DESTDIR)$(LIBDIR)/
	install -m 644 $(INST)/protrain.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	install -m 644 host_api/protrain.h $(DESTDIR)$(INCDIR)/
	install -m 755 $(INST)/sample_host $(PLAN_CLI) $(DESTDIR)$(BINDIR)/
	install -m 644 conf/*.ini $(DESTDIR)$(DATADIR)/
uninstall: ## remove what make install put in PREFIX
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,$(INST_FILES) libprotrain_cuda.so libsample_cuda.so libprotrain_nccl.so) \
	  $(DESTDIR)$(INCDIR)/protrain.h $(DESTDIR)$(BINDIR)/sample_host $(DESTDIR)$(BINDIR)/protrain-plan \
	  $(addprefix $(DESTDIR)$(DATADIR)/,$(notdir $(wildcard conf/*.ini)))
	-rmdir $(DESTDIR)$(DATADIR) $(DESTDIR)$(LIBDIR)/pkgconfig 2>/dev/null
