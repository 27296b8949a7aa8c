"""Finding, loading and calling protrain_plugin.so from Python.

The search follows host_api/loader.c: a spec that contains '/' or ends in .so is
a path; "none" is refused (a Python host needs the plugin); a short name NAME is
looked up as NAME_plugin.so, then libNAME.so, in (1) each directory of
$PROTRAIN_PLUGIN_PATH, (2) the build directory beside this package in a source
tree (what "beside the executable" is for a C host built in the tree), (3) the
installed library directory (`pkg-config --variable=libdir protrain`, else
/usr/local/lib, where `make install` puts it), (4) the dynamic loader's path.
The first file that exists is used; one that exists but does not load is
reported, never skipped.
"""
import ctypes as C
import os
import shutil
import subprocess

from . import _abi as A


class Error(RuntimeError):
    """A non-zero pt_status: .status (code), .status_name and .sentence (the
    plugin's last_error, which names the cause)."""

    def __init__(self, status, sentence, hook=None):
        self.status = int(status)
        self.status_name = A.STATUS_NAMES.get(self.status, "status %d" % self.status)
        self.sentence = sentence
        self.hook = hook
        where = "%s: " % hook if hook else ""
        super().__init__("%s%s: %s" % (where, self.status_name, sentence))


def _installed_libdir():
    if shutil.which("pkg-config"):
        try:
            out = subprocess.run(["pkg-config", "--variable=libdir", "protrain"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return "/usr/local/lib"


def _tree_build_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "build"))


def search_dirs():
    """The directories a short name is looked up in, in order."""
    dirs = [d for d in os.environ.get("PROTRAIN_PLUGIN_PATH", "").split(":") if d]
    dirs.append(_tree_build_dir())
    dirs.append(_installed_libdir())
    return dirs


def _open(path):
    try:
        return C.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        raise Error(A.PT_ERR_IO, "cannot load plugin %s: %s" % (path, e)) from None


def resolve(spec="protrain"):
    """(ctypes library, path) for a plugin spec."""
    if not spec:
        raise Error(A.PT_ERR_INVALID_ARG,
                    "empty plugin spec (give a path or a short name such as \"protrain\")")
    if spec == "none":
        raise Error(A.PT_ERR_INVALID_ARG, "plugin spec \"none\": the PyTorch host needs the plugin")
    if "/" in spec or spec.endswith(".so"):
        if "/" in spec and not os.path.exists(spec):
            raise Error(A.PT_ERR_IO, "plugin file not found: %s" % spec)
        return _open(spec), spec
    dirs = search_dirs()
    for d in dirs:
        for form in ("%s/%s_plugin.so", "%s/lib%s.so"):
            cand = form % (d, spec)
            if os.path.exists(cand):
                return _open(cand), cand
    for form in ("lib%s.so", "%s_plugin.so"):
        try:
            return C.CDLL(form % spec, mode=os.RTLD_NOW | os.RTLD_LOCAL), form % spec
        except OSError as e:
            if "No such file" not in str(e) and "cannot open shared object" not in str(e):
                raise Error(A.PT_ERR_IO, "cannot load plugin %s: %s" % (form % spec, e)) from None
    env = os.environ.get("PROTRAIN_PLUGIN_PATH", "")
    raise Error(A.PT_ERR_IO,
                "plugin file not found: %s (looked for %s_plugin.so and lib%s.so in "
                "$PROTRAIN_PLUGIN_PATH%s, %s, then on the loader path)"
                % (spec, spec, spec, " = " + env if env else " (unset)", ", ".join(dirs[-2:])))


class Table:
    """The plugin's table, copied into a zero-filled pt_plugin_v1 of this
    binding's shape (min(struct_size, sizeof) bytes), so a hook past the plugin's
    struct_size reads NULL (PT_HAS_HOOK)."""

    def __init__(self, spec="protrain"):
        self.lib, self.path = resolve(spec)
        try:
            sym = A.pt_plugin_v1.in_dll(self.lib, A.PLUGIN_SYMBOL)
        except ValueError:
            raise Error(A.PT_ERR_FORMAT, "not a protrain plugin: %s exports no %s symbol"
                        % (self.path, A.PLUGIN_SYMBOL)) from None
        if sym.abi_version != A.ABI_VERSION:
            raise Error(A.PT_ERR_UNSUPPORTED,
                        "plugin ABI mismatch: %s exports %s but its table says abi_version %d, "
                        "this host speaks v%d" % (self.path, A.PLUGIN_SYMBOL, sym.abi_version,
                                                  A.ABI_VERSION))
        if sym.struct_size < A.V1_CORE_BYTES:
            raise Error(A.PT_ERR_FORMAT,
                        "plugin table truncated: struct_size %d bytes, need at least %d in %s"
                        % (sym.struct_size, A.V1_CORE_BYTES, self.path))
        self.t = A.pt_plugin_v1()
        n = min(sym.struct_size, C.sizeof(A.pt_plugin_v1))
        C.memmove(C.addressof(self.t), C.addressof(sym), n)
        self.t.struct_size = n
        self.name = (self.t.name or b"").decode()
        self.version = (self.t.version or b"").decode()

    def has(self, hook):
        f = getattr(A.pt_plugin_v1, hook)
        if f.offset + f.size > self.t.struct_size:
            return False
        return C.cast(getattr(self.t, hook), C.c_void_p).value is not None

    def fn(self, hook):
        if not self.has(hook):
            raise Error(A.PT_ERR_UNSUPPORTED, "the plugin %s (%s) has no %s hook"
                        % (self.path, self.version, hook))
        return getattr(self.t, hook)

    def last_error(self, ctx):
        s = self.t.last_error(ctx)
        return s.decode(errors="replace") if s else "no error text"


class Context:
    """One initialised plugin context. call(hook, *args) raises Error on a
    non-zero status with the plugin's sentence."""

    def __init__(self, table, ini_path, host):
        self.tbl = table
        self.host = host            # kept alive: the plugin holds its callbacks
        ctx = C.c_void_p()
        path = ini_path.encode() if ini_path else None
        rc = table.fn("init")(path, C.byref(host), C.byref(ctx))
        if rc:
            raise Error(rc, table.last_error(None), "init")
        self.ctx = ctx
        self.live = True
        # hook name -> the table's function: looked up once, as a hook call
        # (six per block per step) would otherwise re-read the struct field
        self._fns = {}

    def call(self, hook, *args):
        if not self.live:
            raise Error(A.PT_ERR_ORDER, "%s called after finalize" % hook, hook)
        fn = self._fns.get(hook)
        if fn is None:
            fn = self._fns[hook] = self.tbl.fn(hook)
        rc = fn(self.ctx, *args)
        if rc:
            raise Error(rc, self.tbl.last_error(self.ctx), hook)
        return rc

    def stats(self):
        s = A.pt_stats_v1()
        s.struct_size = C.sizeof(s)
        self.call("get_stats", C.byref(s))
        return s

    def finalize(self):
        if self.live:
            self.live = False
            rc = self.tbl.fn("finalize")(self.ctx)
            if rc:
                raise Error(rc, self.tbl.last_error(self.ctx), "finalize")
