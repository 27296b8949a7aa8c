"""The plugin side of the PyTorch host: the host descriptor and its callbacks
(log, recompute_block, profile_step), the context with its ranks (over
torch.distributed through _dist when a group or torchrun is there), hook
calls that re-raise a callback's exception, and loading.

Planning: the plugin profiles inside post_model_load through profile_step,
which needs a real batch; the adapter therefore defers post_model_load and
create_optimizer to the first forward and profiles with that forward's inputs
(profile_step runs one forward and a backward of the output: the loss when the
model returns one, else the sum of the first output). The plan is made for
that batch's shape; smaller batches reuse it and a larger one is planned for
again (_shapes.ShapePlan, the plugin's replan).
"""
import ctypes as C
import os

import torch

from . import _abi as A
from . import _dist
from . import _log
from . import _model
from . import _state
from ._plugin import Context, Error
from ._schedule import _batch_shape
from ._shapes import padded
from ._windows import _placeholder


def _launcher_rank():
    """(rank, world, local_rank) from the launcher's variables (Open MPI, PMI,
    torchrun style); (0, 1, 0) when none is set."""
    env = os.environ
    for r, w, lr in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                     ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
                     ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        if r in env and w in env:
            return int(env[r]), int(env[w]), int(env.get(lr, env[r]))
    return 0, 1, 0


def _backward_scalar(out):
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    vals = out.values() if isinstance(out, dict) else (out if isinstance(out, (tuple, list)) else [out])
    for v in vals:
        if isinstance(v, torch.Tensor) and v.requires_grad and v.is_floating_point():
            return v.float().sum()
    raise RuntimeError("protrain: profile_step found no output of the model that needs a gradient")


class PluginGlue:
    """Mixin of Adapter: the plugin context, its callbacks and loading."""

    # ---- plugin plumbing ----
    def _make_host(self):
        h = A.pt_host_v1()
        h.abi_version = A.ABI_VERSION
        h.struct_size = C.sizeof(h)
        h.world_size = 1
        h.device_kind = A.PT_DEVICE_AUTO
        self._cbs = (A.LOG_FN(self._cb_log), A.BLOCK_CB(self._cb_recompute),
                     A.USER_CB(self._cb_profile))
        h.log, h.recompute_block, h.profile_step = self._cbs
        self.host = h

    def _open_context(self, config):
        """The CPU run's plugin context. Rank and world come from the launcher's
        variables, or from torch.distributed's default group when one is
        initialised or torchrun started the ranks (_dist.group_for): the
        plugin's collectives then run over that group (pt_host_v1.coll)."""
        rank, world, local = _launcher_rank()
        group = _dist.group_for(cuda=False)
        if group is not None and group[1] > 1:
            rank, world = group
            _dist.check_backend()
            self.hostcoll = _dist.HostColl(rank, world)
            self.host.coll = C.pointer(self.hostcoll.table)
        self.host.rank, self.host.world_size, self.host.local_rank = rank, world, local
        try:
            self.ctx = Context(self.table, config, self.host)
        except Error as e:
            exc = self.hostcoll.take_exc() if self.hostcoll is not None else None
            if exc is not None:
                raise exc from e
            raise

    def call(self, hook, *args):
        try:
            return self.ctx.call(hook, *args)
        except Error as e:
            exc, self.cb_exc = self.cb_exc, None
            if exc is None and self.hostcoll is not None:
                exc = self.hostcoll.take_exc()
            if exc is not None:
                raise exc from e
            raise

    def _cb_log(self, user, level, msg):
        _log.emit(level, msg)

    def _cb_guard(self, fn, *args):
        try:
            fn(*args)
            return 0
        except BaseException as e:   # never unwind through the plugin's C frames
            self.cb_exc = e
            return A.PT_ERR_CALLBACK

    def _cb_profile(self, user):
        return self._cb_guard(self._profile_pass)

    def _cb_recompute(self, user, b):
        return self._cb_guard(self._recompute, b)

    # ---- loading (deferred to the first forward, which profiles) ----
    def _load(self, args, kwargs):
        # after a failed first forward (its profile raised) the parameters
        # hold placeholders: the descriptors made then still hold the values
        if getattr(self, "_keep", None) is None:
            self.params, self._keep = _model.describe(self.infos)
        m = A.pt_model_v1()
        m.struct_size = C.sizeof(m)
        m.n_params = len(self.infos)
        m.params = C.cast(self.params, C.POINTER(A.pt_param_v1))
        m.n_blocks = self.L
        first = _batch_shape(args, kwargs)
        self.shape = self._first_shape(first)
        m.batch, m.seq = self.shape if self.shape is not None else (1, 1)
        self._arch = ("torch:%s:%s" % (type(self.model).__name__, getattr(
            getattr(self.model, "config", None), "model_type", "?"))).encode()
        m.arch = self._arch
        self.model_desc = m
        self.profile_args = padded(args, kwargs, first, self.shape)
        for info in self.infos:
            info.param.data = _placeholder(info.param.dtype, info.shape)
        # the profile's passes draw from the RNG (dropout); fork it so training
        # sees the same random stream as without the plugin
        try:
            with torch.random.fork_rng(devices=self._rng_devices()):
                self.call("post_model_load", C.byref(m))
        except BaseException:
            self._reset_pass()     # the profile's pass, if one was open
            raise
        finally:
            self.profile_args = None
        self._keep = None          # the plugin copied the initial values
        o = A.pt_optim_v1()
        o.struct_size = C.sizeof(o)
        o.type = A.PT_OPTIM_ADAMW
        o.lr, (o.beta1, o.beta2), o.eps = self.optim["lr"], self.optim["betas"], self.optim["eps"]
        o.weight_decay = self.optim["weight_decay"]
        o.max_grad_norm = self.optim["max_grad_norm"]
        self.call("create_optimizer", C.byref(o))
        self.loaded = True
        if self.pending_load:
            files, self.pending_load = self.pending_load, None
            _state.load_files(self, files, self.state_dir)

    def _profile_pass(self):
        args, kwargs = self.profile_args
        kwargs = self.no_cache(kwargs)
        self.profiling = True
        try:
            with torch.enable_grad():
                out = self.model(*args, **kwargs)
                _backward_scalar(out).backward()
            self._finish_backward()
            self._unbind(self.nonblock)
        finally:
            self.profiling = False

    def _check_stream(self):
        """On cuda the plugin orders its work against the stream it was given at
        init; kernels on another stream would race with its copies and frees."""
        cur = torch.cuda.current_stream(self.device)
        if cur.cuda_stream != self.session.stream.cuda_stream:
            raise RuntimeError(
                "protrain: the current CUDA stream is not the one protrain.torch.init gave the "
                "plugin; run the model on protrain.torch.stream() (the plugin orders its copies "
                "and frees against that stream only)")

