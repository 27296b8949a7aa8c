"""The PyTorch host: drives the plugin's hooks from module hooks and autograd.

Windows (protrain.h, host contract 2): a block's parameters point into the
plugin's storage only between block_pre_forward/block_post_forward and between
block_pre_backward/block_post_backward; outside them .data is an empty
placeholder, so a stray use fails with a shape error instead of reading stale
memory. Non-block parameters are bound from the start of a pass (pre_step) to
optimizer_step (an evaluation pass: to the end of the forward).

Backward order: block_pre_backward(b) runs in the block's full backward
pre-hook, when the gradient of its output is complete. block_post_backward(b)
waits for two things: every trainable parameter of the block has had its
gradient accumulated (post-accumulate-grad hooks, counted per block), and the
gradient has left the block (block b-1's backward pre-hook, or the end of the
backward pass). A count alone is not enough: a norm's weight gradient lands
before the norm's remaining backward nodes, which still read the block's saved
tensors. A block autograd never enters (frozen, with an input that needs no
gradient) gets its two hooks when the pass moves past it.

Micro-batches: grad_accum = N forward/backward passes before optimizer.step()
are pre_step(step, m, N), m = 0..N-1; a forward with gradients disabled is an
evaluation pass, pre_step(step, -1, 0).

Planning: the plugin profiles inside post_model_load through profile_step,
which needs a real batch; the adapter therefore defers post_model_load and
create_optimizer to the first forward and profiles with that forward's inputs
(profile_step runs one forward and a backward of the output: the loss when the
model returns one, else the sum of the first output). The plan is made for
that batch's shape, and the ABI has no hook to plan again: a training batch of
another shape is refused (_check_shape).
"""
import contextlib
import ctypes as C
import os

import torch

from . import _abi as A
from . import _acts
from . import _dist
from . import _mem
from . import _model
from ._plugin import Context, Error, Table

_EMPTY = {}


def _placeholder(dtype):
    key = (dtype, _mem._device)
    t = _EMPTY.get(key)
    if t is None:
        t = _EMPTY[key] = _mem.empty(0, dtype)
    return t


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


def _batch_shape(args, kwargs):
    """(batch, sequence) of a forward's inputs: the first two dimensions of
    input_ids, else inputs_embeds, else the first positional tensor; None when
    none of them is a tensor of 2 or more dimensions."""
    t = kwargs.get("input_ids")
    if not isinstance(t, torch.Tensor):
        t = kwargs.get("inputs_embeds")
    if not isinstance(t, torch.Tensor) and args:
        t = args[0]
    if isinstance(t, torch.Tensor) and t.dim() >= 2:
        return int(t.shape[0]), int(t.shape[1])
    return None


def _shape_text(shape):
    if shape is None:
        return "a batch without a 2-D input_ids / inputs_embeds tensor"
    return "batch %d x sequence %d" % shape


def _backward_scalar(out):
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    vals = out.values() if isinstance(out, dict) else (out if isinstance(out, (tuple, list)) else [out])
    for v in vals:
        if isinstance(v, torch.Tensor) and v.requires_grad and v.is_floating_point():
            return v.float().sum()
    raise RuntimeError("protrain: profile_step found no output of the model that needs a gradient")


class Adapter:
    def __init__(self, model, blocks, config, optim, grad_accum, plugin, session=None):
        self.model = model
        self.blocks = list(blocks)
        self.L = len(self.blocks)
        self.grad_accum = int(grad_accum)
        self.optim = optim
        self.session = session
        self.device = session.device if session is not None else None
        self.infos = _model.collect(model, self.blocks, self.device)
        self.block_params = [[] for _ in range(self.L)]
        self.nonblock = []
        for i, info in enumerate(self.infos):
            (self.nonblock if info.block < 0 else self.block_params[info.block]).append(i)
        self.n_trainable = [sum(self.infos[i].trainable for i in ps) for ps in self.block_params]
        self.cb_exc = None
        self.hostcoll = None         # _dist.HostColl: the plugin's collectives over torch.distributed
        if session is None:
            self.table = Table(plugin)
            self._make_host()
            rank, world, local = _launcher_rank()
            group = _dist.group_for(cuda=False)
            if group is not None and group[1] > 1:   # the plugin runs over torch.distributed
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
        else:       # cuda: the context protrain.torch.init made; its callbacks reach us
            self.table, self.host, self.ctx = session.table, session.host, session.ctx
            session.adapter = self
            _model.buffers_to(model, self.device)
        self.rank, self.world = self.host.rank, self.host.world_size
        self.loaded = False
        self.step = 0
        self.micro = 0               # micro-batches run in the current step
        self.loss_sum = 0.0
        self.loss_n = 0
        self.lr_set = None
        self.profiling = False
        self.recomputing = None
        self.training_pass = False
        self.in_pass = False
        self.bw_started = False
        self.next_fwd = 0
        self.next_bw = -1
        self.bw_open = -1
        self.count = [0] * self.L
        self.acts = [_acts.BlockActs(b) for b in range(self.L)]
        self.inputs = [None] * self.L
        self.rng = [None] * self.L
        self.amp = [None] * self.L
        self.pending_load = None
        self.shape = None            # (batch, sequence) the plan was profiled for
        # activation modes (_acts: COPY, REF, META) per block under the current
        # plan, from the plan's counts or its first training pass (_check_plan)
        self.act_modes = [_acts.COPY] * self.L
        self.plan_sig = None
        self.learning = False
        self.swap_seen = 0
        self.swapped = [False] * self.L
        self.recomputed = [False] * self.L
        # test switches for the negative controls (never set in normal use):
        # close a block at its first accumulated gradient; keep the forward's
        # parameter views through backward instead of rebinding at each hook;
        # close a block when its count completes, not when the gradient has left it
        self.skip_post_backward_wait = False
        self.post_backward_at_count = False
        self.skip_rebind = False
        self._install()

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
        if level <= A.PT_LOG_WARN or os.environ.get("PROTRAIN_PY_LOG"):
            print("[protrain] %s" % msg.decode(errors="replace"), flush=True)

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

    # ---- parameter windows ----
    def _bind(self, idx, grads):
        for i in idx:
            info = self.infos[i]
            d = self.params[i]
            p = info.param
            if d.data is None:
                raise RuntimeError("protrain: the plugin gave no address for %s inside its window"
                                   % info.name)
            p.data = _mem.view(d.data, p.dtype, info.shape)
            if grads and info.trainable:
                if d.grad is None:
                    raise RuntimeError("protrain: the plugin gave no gradient address for %s"
                                       % info.name)
                p.grad = _mem.view(d.grad, p.dtype, info.shape)

    def _unbind(self, idx):
        for i in idx:
            p = self.infos[i].param
            p.grad = None
            p.data = _placeholder(p.dtype)

    # ---- loading (deferred to the first forward, which profiles) ----
    def _load(self, args, kwargs):
        self.params, self._keep = _model.describe(self.infos)
        m = A.pt_model_v1()
        m.struct_size = C.sizeof(m)
        m.n_params = len(self.infos)
        m.params = C.cast(self.params, C.POINTER(A.pt_param_v1))
        m.n_blocks = self.L
        self.shape = _batch_shape(args, kwargs)
        m.batch, m.seq = self.shape if self.shape is not None else (1, 1)
        self._arch = ("torch:%s:%s" % (type(self.model).__name__, getattr(
            getattr(self.model, "config", None), "model_type", "?"))).encode()
        m.arch = self._arch
        self.model_desc = m
        self.profile_args = (args, kwargs)
        for info in self.infos:
            info.param.data = _placeholder(info.param.dtype)
        # the profile's passes draw from the RNG (dropout); fork it so training
        # sees the same random stream as without the plugin
        with torch.random.fork_rng(devices=self._rng_devices()):
            self.call("post_model_load", C.byref(m))
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
            d, self.pending_load = self.pending_load, None
            self.call("load_state", d.encode())

    def _profile_pass(self):
        args, kwargs = self.profile_args
        self.profiling = True
        try:
            with torch.enable_grad():
                out = self.model(*args, **kwargs)
                _backward_scalar(out).backward()
            self._finish_backward()
            self._unbind(self.nonblock)
        finally:
            self.profiling = False

    # ---- the model's forward ----
    def forward(self, orig, args, kwargs):
        if self.recomputing is not None:
            return orig(*args, **kwargs)
        if not self.profiling:
            if self.device is not None:
                self._check_stream()
            if not self.loaded:
                self._load(args, kwargs)
            self._check_previous_pass()
            training = torch.is_grad_enabled()
            if training:
                self._check_shape(args, kwargs)
                if self.micro >= self.grad_accum:
                    raise RuntimeError(
                        "protrain: forward pass %d of a step with grad_accum = %d; call "
                        "optimizer.step() after every %d forward/backward passes"
                        % (self.micro + 1, self.grad_accum, self.grad_accum))
                if self.micro == 0:
                    self.step += 1
                self.call("pre_step", self.step, self.micro, self.grad_accum)
                if self.micro == 0 and self.table.has("set_lr"):
                    self.lr_set = float(self.optimizer.param_groups[0]["lr"])
                    self.call("set_lr", self.lr_set)
                self.micro += 1
                self._check_plan()
            else:
                self.call("pre_step", self.step, -1, 0)
            self.training_pass = training
        else:
            self.training_pass = True
            self.learning = False
        self._bind(self.nonblock, grads=self.training_pass)
        self.in_pass = True
        self.next_fwd = 0
        self.bw_started = False
        self.next_bw = self.L - 1
        self.bw_open = -1
        self.count = [0] * self.L
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            out = orig(*args, **kwargs)
        if self.next_fwd != self.L:
            raise RuntimeError("protrain: the forward ran blocks 0..%d of %d; every block must run "
                               "once per forward" % (self.next_fwd - 1, self.L))
        if not self.training_pass:
            self.call("block_post_forward", self.L - 1)
            self._unbind(self.block_params[self.L - 1])
            self._unbind(self.nonblock)
            self.in_pass = False
        elif not self.profiling:
            loss = getattr(out, "loss", None)
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                self.loss_sum += float(loss.detach())
                self.loss_n += 1
        return out

    def _check_shape(self, args, kwargs):
        """The plan (chunk buffers, activation modes, the predicted peak and
        times) was searched on the profile of the first forward's batch; the
        ABI has no hook to profile and plan again, so a training batch of
        another shape would run on a plan measured for other activation sizes.
        Evaluation passes are not checked: they ask for no arena."""
        shape = _batch_shape(args, kwargs)
        if shape != self.shape:
            raise RuntimeError(
                "protrain: this training batch is %s, but the plan was profiled and made for %s "
                "(the first forward's); the plugin has no hook to profile and plan again, and a "
                "plan is only valid for the activation sizes it measured: keep the shape (pad or "
                "pack to the profiled length, drop a short last batch), or wrap the model again "
                "for the new shape" % (_shape_text(shape), _shape_text(self.shape)))

    def _check_previous_pass(self):
        if self.in_pass and self.training_pass:
            if not self.bw_started:
                raise RuntimeError(
                    "protrain: a training forward ran without its backward; call backward() on "
                    "its loss before the next forward or optimizer.step() (an evaluation "
                    "forward runs under torch.no_grad())")
            self._finish_backward()

    # ---- activation modes under the plan ----
    def _check_plan(self):
        """At each training pass: has the plan changed since the modes were learned?

        The ABI says how many blocks are SWAP and CKPT but not which. Unless
        the counts leave no choice (no SWAP and no CKPT block, or every block
        one mode), the adapter learns it from what the plugin does on the first
        training pass under a plan, with every block in COPY mode (correct
        under any mode): a block whose block_post_forward raised swap_bytes is
        SWAP, one the plugin recomputed is CKPT, the rest are NONE. The plan
        can change while training (the plugin re-plans after calibration;
        load_state restores a saved plan): its counts and predictions, compared
        here, change with it, and the modes are learned again. A checkpointed block taken for NONE
        only costs memory (see _recompute); a NONE or SWAP block taken for CKPT
        would lose its activations, and block_pre_backward refuses that.
        On cuda every block copies: torch's own tensors are plugin memory there
        (the allocator shim), so keeping them besides the arena would count the
        block's activations twice against the plan."""
        if self.device is not None:
            return
        s = self.ctx.stats()
        sig = (s.n_persist, s.n_buffer, s.n_swap, s.n_checkpoint, s.n_chunk, s.pred_peak,
               s.pred_iter_s, s.mode)
        self.learning = sig != self.plan_sig
        if self.learning:
            self.plan_sig = sig
            self.swap_seen = s.swap_bytes
            # counts that leave no choice need no learning pass
            ns, nc, n = s.n_swap, s.n_checkpoint, self.L
            uniform = _acts.REF if ns == 0 and nc == 0 else (
                _acts.META if nc == n else _acts.COPY if ns == n else None)
            if uniform is not None:
                self.learning = False
            self.act_modes = [uniform or _acts.COPY] * n

    # ---- block forward ----
    def block_pre_forward(self, b, module, args, kwargs):
        if self.recomputing is not None or not self.in_pass:
            return None
        if b != self.next_fwd:
            if b < self.next_fwd:
                raise RuntimeError(
                    "protrain: block %d was called twice in one forward; each block runs once per "
                    "forward (its parameters and activations are the plugin's for one window)" % b)
            raise RuntimeError("protrain: block %d ran before block %d; blocks must run in order"
                               % (b, self.next_fwd))
        if self.training_pass:
            for k in ("cache", "past_key_values", "past_key_value", "layer_past"):
                if kwargs.get(k) is not None:
                    raise RuntimeError(
                        "protrain: block %d got a KV cache (%s) in a training pass; train with "
                        "use_cache=False (model.config.use_cache = False): a recomputed block "
                        "would append to the cache" % (b, k))
        self.call("block_pre_forward", b)
        self._bind(self.block_params[b], grads=False)
        if self.training_pass:
            self.acts[b].begin(_acts.COPY if self.profiling else self.act_modes[b])
            self.recomputed[b] = False
            self.inputs[b] = (args, kwargs)
            self._bound_ptrs(b)
            self.rng[b] = self._rng_state()
            self.amp[b] = self._autocast_state()
        self.cur_fwd = b
        return None

    def block_post_forward(self, b, module, args, kwargs, out):
        if self.recomputing is not None or not self.in_pass:
            return None
        self.cur_fwd = None
        self.next_fwd = b + 1
        if not self.training_pass:
            if b < self.L - 1:      # the last block's window ends with the model's forward
                self.call("block_post_forward", b)
                self._unbind(self.block_params[b])
            return None
        acts = self.acts[b]
        nbytes = acts.plan()
        ptr = C.c_void_p()
        self.call("activation_arena", b, max(nbytes, _acts.ALIGN), C.byref(ptr))
        acts.store(ptr.value)
        self.call("block_post_forward", b)
        if self.learning:
            # a SWAP block's arena starts its copy to pinned memory in
            # block_post_forward, which the cumulative swap_bytes counter shows
            sb = self.ctx.stats().swap_bytes
            self.swapped[b] = sb > self.swap_seen
            self.swap_seen = sb
        if not self.skip_rebind:
            self._unbind(self.block_params[b])
        return None

    # ---- saved tensors ----
    cur_fwd = None
    param_ptrs = {}
    param_ids = frozenset()

    def _is_param(self, t):
        """t is one of the parameters bound in the current window (the set is
        _bound_ptrs's, rebuilt at each block's forward and recompute)."""
        return id(t) in self.param_ids

    def _pack(self, t):
        if self.recomputing is not None:
            b = self.recomputing
            if not self._is_param(t) and \
                    t.untyped_storage().data_ptr() not in self.param_ptrs:
                self.acts[b].refill_one(t)
            return None
        b = self.cur_fwd
        if b is None or self._is_param(t):
            return t
        i = self.param_ptrs.get(t.untyped_storage().data_ptr())
        if i is not None:
            return _acts.ParamView(i, t)
        acts = self.acts[b]
        if acts.mode is _acts.REF:
            acts.add(t, copy=False)
            return t
        return acts.add(t, copy=acts.mode is _acts.COPY)

    def _unpack(self, h):
        if isinstance(h, torch.Tensor):
            return h
        if isinstance(h, _acts.Handle):
            return self.acts[h.block].view(h)
        if isinstance(h, _acts.ParamView):
            blk = self.infos[h.index].block
            ptr = self.params[h.index].data
            if ptr is None or (blk >= 0 and blk != self.bw_open):
                raise RuntimeError(
                    "protrain: a saved view of %s (block %d) was used outside its backward "
                    "window (between block_pre_backward and block_post_backward)"
                    % (self.infos[h.index].name, blk))
            return h.view(ptr)
        return h

    def _bound_ptrs(self, b):
        """Address -> parameter index for the parameters bound in block b's window
        (its own and the non-block ones): a saved tensor on one of these storages
        is a view of that parameter."""
        self.param_ptrs = {self.params[i].data: i for i in self.block_params[b]}
        self.param_ptrs.update((self.params[i].data, i) for i in self.nonblock)
        self.param_ptrs.pop(None, None)
        self.param_ids = {id(self.infos[i].param) for i in self.block_params[b]}
        self.param_ids.update(id(self.infos[i].param) for i in self.nonblock)

    # ---- block backward ----
    def _end_of_backward(self):
        try:
            self._finish_backward()
        except BaseException as e:
            self.cb_exc = e
            raise

    def _finish_backward(self):
        if self.in_pass and self.training_pass:
            self._advance_backward(-1)
            self.in_pass = False
            self.learning = False

    def _post_backward(self, b):
        if self.learning:
            self.act_modes[b] = _acts.COPY if self.swapped[b] else (
                _acts.META if self.recomputed[b] else _acts.REF)
        self.acts[b].base = None
        self.acts[b].kept = []
        self.call("block_post_backward", b)
        self._unbind(self.block_params[b])
        self.inputs[b] = None
        self.rng[b] = None
        self.amp[b] = None

    def _advance_backward(self, b):
        """Close every block above b: the open one gets block_post_backward, one
        autograd never entered gets both hooks (it has no gradient to add)."""
        while self.next_bw > b:
            k = self.next_bw
            if self.bw_open != k:
                self.call("block_pre_backward", k)
            self.bw_open = -1
            self._post_backward(k)
            self.next_bw = k - 1

    def block_pre_backward(self, b, module, grad_out):
        if self.recomputing is not None or not self.in_pass or not self.training_pass:
            return None
        if not self.bw_started:
            self.bw_started = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        if b > self.next_bw or b == self.bw_open:
            raise RuntimeError("protrain: backward entered block %d after block %d; each block's "
                               "backward runs once, from the last block down" % (b, self.next_bw + 1))
        self._advance_backward(b)
        self.call("block_pre_backward", b)
        self.bw_open = b
        if self.acts[b].mode is _acts.META and not self.recomputed[b]:
            raise RuntimeError(
                "protrain: block %d was checkpointed under the plan its forward ran with (its "
                "saved tensors were dropped), but block_pre_backward(%d) did not recompute it: "
                "the plan changed between the forward and the backward" % (b, b))
        if not self.skip_rebind:
            self._bind(self.block_params[b], grads=True)
        else:   # negative control: backward reads the addresses its forward had
            self._bind_grads_only(b)
        ptr = C.c_void_p()
        self.call("activation_arena_get", b, C.byref(ptr))
        self.acts[b].base = ptr.value
        return None

    def _bind_grads_only(self, b):
        for i in self.block_params[b]:
            info = self.infos[i]
            if info.trainable:
                info.param.grad = _mem.view(self.params[i].grad, info.param.dtype, info.shape)

    def grad_accumulated(self, b):
        if self.recomputing is not None or not self.training_pass:
            return
        self.count[b] += 1
        early = (self.skip_post_backward_wait and self.count[b] == 1) or (
            self.post_backward_at_count and self.count[b] == self.n_trainable[b])
        if early and self.bw_open == b:
            # negative control: close the block at its first gradient
            self.bw_open = -1
            self._post_backward(b)
            self.next_bw = b - 1

    # ---- random state: the CPU generator, and on cuda the device's too ----
    def _rng_devices(self):
        return [] if self.device is None else [self.device.index]

    def _rng_state(self):
        cpu = torch.get_rng_state()
        return (cpu, None) if self.device is None else (cpu, torch.cuda.get_rng_state(self.device))

    def _set_rng_state(self, st):
        torch.set_rng_state(st[0])
        if st[1] is not None:
            torch.cuda.set_rng_state(st[1], self.device)

    def _autocast_state(self):
        """Autocast as a block's forward ran (per device type, and the cast
        cache), for its recompute: the recompute runs inside the backward,
        where the forward's autocast region has usually been left, and must
        compute in the dtypes the forward did."""
        devs = ("cpu",) if self.device is None else ("cpu", self.device.type)
        return ([(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devs],
                torch.is_autocast_cache_enabled())

    def _check_stream(self):
        """On cuda the plugin orders its work against the stream it was given at
        init; kernels on another stream would race with its copies and frees."""
        cur = torch.cuda.current_stream(self.device)
        if cur.cuda_stream != self.session.stream.cuda_stream:
            raise RuntimeError(
                "protrain: the current CUDA stream is not the one protrain.torch.init gave the "
                "plugin; run the model on protrain.torch.stream() (the plugin orders its copies "
                "and frees against that stream only)")

    # ---- recompute (CKPT) ----
    def _recompute(self, b):
        if self.inputs[b] is None:
            raise RuntimeError("protrain: recompute_block(%d) without a saved input" % b)
        self.recomputed[b] = True
        if self.acts[b].mode is _acts.REF:
            # the plan checkpoints a block the adapter took for NONE: autograd
            # still holds the forward's tensors and backward reads those (only
            # memory is lost; the recompute below writes an arena nobody
            # reads); learn the modes again at the next pass
            self.plan_sig = None
        args, kwargs = self.inputs[b]
        ptr = C.c_void_p()
        self.call("activation_arena_get", b, C.byref(ptr))
        acts = self.acts[b]
        acts.base, acts.refill, acts.kept = ptr.value, 0, []
        self._bind(self.block_params[b], grads=False)
        self._bound_ptrs(b)
        self.recomputing = b
        amp, cache = self.amp[b]
        try:
            with contextlib.ExitStack() as ctx:
                ctx.enter_context(torch.random.fork_rng(devices=self._rng_devices()))
                ctx.enter_context(torch.enable_grad())
                ctx.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack,
                                                                           self._unpack))
                for dev, on, dtype in amp:
                    ctx.enter_context(torch.autocast(dev, dtype=dtype, enabled=on,
                                                     cache_enabled=cache))
                self._set_rng_state(self.rng[b])
                self.blocks[b].forward(*args, **kwargs)
        finally:
            self.recomputing = None
        if acts.refill != len(acts.layout):
            raise RuntimeError("protrain: the recompute of block %d saved %d tensors, its forward "
                               "saved %d" % (b, acts.refill, len(acts.layout)))
        acts.refill = None

    # ---- optimizer ----
    def optimizer_step(self, lr):
        if not self.loaded:
            raise RuntimeError("protrain: optimizer.step() before the first forward/backward")
        self._check_previous_pass()
        if self.micro != self.grad_accum:
            raise RuntimeError("protrain: optimizer.step() after %d forward/backward passes; "
                               "grad_accum = %d" % (self.micro, self.grad_accum))
        self.call("optimizer_step", float(lr))
        self._unbind(self.nonblock)
        loss = self.loss_sum / self.loss_n if self.loss_n else float("nan")
        self.call("post_step", self.step, loss)
        self.micro, self.loss_sum, self.loss_n = 0, 0.0, 0

    # ---- hooks ----
    def _install(self):
        model, ad = self.model, self
        orig = model.forward

        def forward(*args, **kwargs):
            return ad.forward(orig, args, kwargs)

        model.forward = forward
        self.handles = []
        for b, blk in enumerate(self.blocks):
            self.handles.append(blk.register_forward_pre_hook(
                lambda m, a, k, b=b: ad.block_pre_forward(b, m, a, k), with_kwargs=True))
            self.handles.append(blk.register_forward_hook(
                lambda m, a, k, o, b=b: ad.block_post_forward(b, m, a, k, o), with_kwargs=True))
            self.handles.append(blk.register_full_backward_pre_hook(
                lambda m, g, b=b: ad.block_pre_backward(b, m, g)))
            for i in self.block_params[b]:
                if self.infos[i].trainable:
                    self.handles.append(self.infos[i].param.register_post_accumulate_grad_hook(
                        lambda p, b=b: ad.grad_accumulated(b)))

    def read_param(self, i):
        info = self.infos[i]
        if not self.loaded:
            return info.param.detach().clone()
        out = torch.empty(info.shape, dtype=info.param.dtype)
        self.call("read_param", i, C.c_void_p(out.data_ptr()),
                  out.numel() * out.element_size())
        return out
