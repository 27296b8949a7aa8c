"""The PyTorch host: drives the plugin's hooks from module hooks and autograd.

Adapter is the state of one wrapped model; its methods come from one mixin per
concern:
  _glue.PluginGlue       the host descriptor, callbacks, hook calls, loading
                         (post_model_load and create_optimizer at the first
                         forward, which profiles)
  _windows.ParamWindows  parameter windows (bind/unbind, placeholders), the
                         saved-tensor hooks, read_param
  _schedule.StepSchedule the wrapped forward: pre_step, micro-batches, the
                         plan check, optimizer_step/post_step
  _shapes.ShapePlan      the plan's batch shape: smaller batches reuse it, a
                         larger one is planned for (replan)
  _recover.StepRecovery  a failed pass dropped with its step (discard_step)
  _blocks.BlockHooks     block forward windows and the backward order
  _recompute.Recompute   CKPT recompute with the forward's RNG and autocast
  _hooks.HookInstall     module and autograd hook installation
  _saves.Saves           state_dict and load_state_dict through the plugin
  _clip.Clipping         torch.nn.utils.clip_grad_norm_ through the plugin
  _dtype.DtypeGuard      dtype conversions after wrap refused
"""
from . import _acts
from . import _model
from ._blocks import BlockHooks
from ._clip import Clipping
from ._dtype import DtypeGuard
from ._glue import PluginGlue, _launcher_rank
from ._hooks import HookInstall
from ._plugin import Table
from ._recompute import Recompute
from ._recover import StepRecovery
from ._saves import Saves
from ._schedule import StepSchedule
from ._shapes import ShapePlan, check_plan_shape
from ._windows import ParamWindows

__all__ = ["Adapter", "_launcher_rank", "check_plan_shape"]


class Adapter(PluginGlue, ParamWindows, StepSchedule, ShapePlan, StepRecovery, BlockHooks,
              Recompute, HookInstall, Saves, Clipping, DtypeGuard):
    """One wrapped model: the state every part of the adapter shares. The
    methods live with their concern: _glue (the plugin context, callbacks,
    loading), _windows (parameter windows, saved tensors, read_param),
    _schedule (passes, micro-batches, the step), _blocks (block hooks and
    backward order), _recompute (CKPT), _hooks (installing the hooks), _saves
    (state-dict hooks), _clip (clip_grad_norm_)."""

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
        self.hostcoll = None         # _dist.HostColl when the ranks meet over torch.distributed
        if session is None:
            self.table = Table(plugin)
            self._make_host()
            self._open_context(config)
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
        self.clip_called = False     # clip_grad_norm_ called in this step
        self.pending_load = None     # state files to load at the first forward
        self.state_dir = None        # parent of the scratch folders of state files
        self.shape = None            # (batch, sequence) the plan was profiled for
        self.replans = 0             # plans made for a larger batch (_shapes)
        self.plan_shape = None       # wrap(plan_shape=): the least shape to plan for
        self.dropped_steps = 0       # steps dropped after a failure (_recover)
        self.just_dropped = False    # the last training pass's step was dropped
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
        # the plan's batch shape frozen (refuse any other, no replan); a
        # failed pass left in place instead of dropped
        self.frozen_shape = False
        self.skip_discard = False
        self._install_dtype_guard()
        self._install()
