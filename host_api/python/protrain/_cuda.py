"""The PyTorch host on a CUDA device: one plugin context per process, made by
protrain.torch.init before CUDA starts, and the allocator shim that sends every
torch CUDA allocation to that context's dev_alloc/dev_free.

Order: torch fixes its allocator when CUDA initialises, so the shim must be
installed before the first CUDA call that allocates (model.to("cuda"), a CUDA
tensor, even torch.cuda.current_stream()). init therefore refuses when CUDA is
already initialised. After the swap it creates a stream, makes it torch's
current stream and gives it to the plugin as compute_stream with
PT_HOST_ASYNC_COMPUTE: torch enqueues the host's kernels on it and the plugin
orders its copies and frees against it with events. torch's default stream is
not used because its handle is NULL, which the ABI reads as "the plugin's own
stream".
"""
import ctypes as C
import os

import torch

from . import _abi as A
from . import _log
from . import _mem
from ._plugin import Context, Table, _installed_libdir, _tree_build_dir

SHIM = "pt_torch_alloc.so"
_session = None


def shim_path():
    """The shim beside the plugin: $PROTRAIN_PLUGIN_PATH, the tree's build
    directory, the installed library directory, in that order."""
    dirs = [d for d in os.environ.get("PROTRAIN_PLUGIN_PATH", "").split(":") if d]
    dirs += [os.environ.get("PT_BUILD", ""), _tree_build_dir(), _installed_libdir()]
    for d in dirs:
        if d and os.path.exists(os.path.join(d, SHIM)):
            return os.path.join(d, SHIM)
    raise RuntimeError("protrain.torch.init: the allocator shim %s is not built (run make); "
                       "looked in %s" % (SHIM, ", ".join(d for d in dirs if d)))


class Shim:
    """ctypes view of pt_torch_alloc.so."""

    def __init__(self, path=None):
        self.path = path or shim_path()
        self.lib = C.CDLL(self.path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self.lib.pt_torch_alloc.restype = C.c_void_p
        self.lib.pt_torch_alloc.argtypes = [C.c_size_t, C.c_int, C.c_void_p]
        self.lib.pt_torch_free.restype = None
        self.lib.pt_torch_free.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_void_p]
        self.lib.pt_torch_alloc_set.restype = None
        self.lib.pt_torch_alloc_set.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_int]
        self.lib.pt_torch_alloc_failures.restype = C.c_uint64

    def point_at(self, ctx, device):
        """Route the shim to a live Context (None: refuse every request)."""
        if ctx is None:
            self.lib.pt_torch_alloc_set(None, None, None, -1)
            return
        t = ctx.tbl
        self.lib.pt_torch_alloc_set(ctx.ctx, C.cast(t.fn("dev_alloc"), C.c_void_p),
                                    C.cast(t.fn("dev_free"), C.c_void_p), int(device))

    def alloc(self, size, device, stream=None):
        return self.lib.pt_torch_alloc(size, device, stream)

    def free(self, ptr, size, device, stream=None):
        self.lib.pt_torch_free(ptr, size, device, stream)

    def failures(self):
        return int(self.lib.pt_torch_alloc_failures())


class Session:
    """The process's CUDA plugin context; wrap() hands it to its Adapter, whose
    methods the callbacks reach through self.adapter."""

    def __init__(self, config, plugin, index, rank, world, local):
        self.device = torch.device("cuda", index)
        self.config = os.path.abspath(config) if config is not None else None
        self.adapter = None
        self.table = Table(plugin)
        self.shim = Shim()
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            self.shim.path, "pt_torch_alloc", "pt_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
        self.allocator = alloc
        torch.cuda.set_device(self.device)
        self.stream = torch.cuda.Stream(self.device)
        torch.cuda.set_stream(self.stream)
        h = A.pt_host_v1()
        h.abi_version = A.ABI_VERSION
        h.struct_size = C.sizeof(h)
        h.rank, h.world_size, h.local_rank = rank, world, local
        h.device_kind = A.PT_DEVICE_CUDA
        h.device_index = index
        h.flags = A.PT_HOST_ASYNC_COMPUTE
        h.compute_stream = self.stream.cuda_stream
        self._cbs = (A.LOG_FN(self._log), A.BLOCK_CB(self._recompute), A.USER_CB(self._profile))
        h.log, h.recompute_block, h.profile_step = self._cbs
        self.host = h
        self.ctx = Context(self.table, config, h)
        self.shim.point_at(self.ctx, index)
        _mem.set_device(self.device)

    def _log(self, user, level, msg):
        if self.adapter is not None:
            return self.adapter._cb_log(user, level, msg)
        _log.emit(level, msg)

    def _recompute(self, user, b):
        if self.adapter is None:
            return A.PT_ERR_CALLBACK
        return self.adapter._cb_recompute(user, b)

    def _profile(self, user):
        if self.adapter is None:
            return A.PT_ERR_CALLBACK
        return self.adapter._cb_profile(user)


def init(config, plugin, device, launcher):
    """See protrain.torch.init."""
    global _session
    if _session is not None:
        raise RuntimeError("protrain.torch.init: already called in this process (one plugin "
                           "context serves every CUDA allocation of the process)")
    if config is not None and not os.path.isfile(config):
        raise ValueError("protrain.torch.init: config file %s does not exist" % config)
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError("protrain.torch.init: device %s; init is for a CUDA device (on the CPU "
                         "the host backend needs no init: call wrap)" % dev)
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "protrain.torch.init: CUDA is already initialised in this process, so torch's "
            "allocator can no longer be replaced; call protrain.torch.init before the first "
            "CUDA allocation (before model.to(\"cuda\") or any CUDA tensor)")
    if not torch.cuda.is_available():
        raise RuntimeError("protrain.torch.init: no CUDA device (torch.cuda.is_available() is "
                           "False); the PyTorch host runs on the CPU with backend = host instead")
    rank, world, local = launcher()
    index = dev.index if dev.index is not None else local % max(torch.cuda.device_count(), 1)
    _session = Session(config, plugin, index, rank, world, local)
    return _session


def session():
    return _session
