"""protrain.torch: train a PyTorch model through protrain_plugin.so.

    model, optimizer = protrain.torch.wrap(model, config="path.ini")
    for batch in data:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        scheduler.step()          # any torch.optim.lr_scheduler

After wrap the plugin owns every parameter, gradient and saved activation (see
_windows.py for the windows and _blocks.py for the hook order). Read the trained weights with
protrain.torch.state_dict(model).
"""
import os

import torch

from . import _adapter
from . import _cuda
from . import _log
from . import _model
from . import _state


class Optimizer(torch.optim.Optimizer):
    """The plugin's optimizer seen as a torch.optim.Optimizer. step() calls
    optimizer_step with the param group's current lr (so lr schedulers work);
    zero_grad() does nothing (the plugin zeroes gradients after each step);
    state_dict() is self-contained: the plugin's state file (weights, masters,
    moments, step) travels inside it as bytes (_state.py), so torch.save puts
    it in the checkpoint and nothing is left on disk; before the first forward
    the plugin has no state yet and the dict carries none (a round trip then
    changes nothing, as accelerate's prepare does). load_state_dict() restores
    it bit-exactly (before the first forward: at it, after post_model_load)."""

    def __init__(self, adapter, params, lr, betas, eps, weight_decay, state_dir):
        self._ad = adapter
        adapter.state_dir = state_dir
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._ad.optimizer_step(float(self.param_groups[0]["lr"]))
        return loss

    def zero_grad(self, set_to_none=True):
        return None

    def state_dict(self):
        ad = self._ad
        groups, n = [], 0
        for g in self.param_groups:
            k = len(g["params"])
            groups.append(dict({a: v for a, v in g.items() if a != "params"},
                               params=list(range(n, n + k))))
            n += k
        files = _state.save_files(ad, ad.state_dir) if ad.loaded else (
            ad.pending_load if ad.pending_load else None)
        return {"state": {}, "param_groups": groups,
                "protrain": {"step": ad.step, "files": files}}

    def load_state_dict(self, state_dict):
        pt = state_dict.get("protrain") if isinstance(state_dict, dict) else None
        if not isinstance(pt, dict):
            raise ValueError("protrain: load_state_dict needs a dict from this optimizer's "
                             "state_dict() (it has no 'protrain' entry)")
        ad = self._ad
        files = pt.get("files")
        if files is None and ad.loaded:
            raise ValueError(
                "protrain: this optimizer state was saved before the first forward and holds "
                "no plugin state, but the plugin has trained since; it cannot be rewound to "
                "its initial state (save after a step to resume from it)")
        for g, s in zip(self.param_groups, state_dict.get("param_groups", [])):
            g.update({k: v for k, v in s.items() if k != "params"})
        if files is not None:
            if ad.loaded:
                _state.load_files(ad, files, ad.state_dir)
                ad.values_changed()
            else:
                ad.pending_load = files
        ad.step = int(pt.get("step", ad.step))


def init(config=None, device="cuda", plugin="protrain"):
    """Start the plugin on a CUDA device and route every torch CUDA allocation
    through it (torch.cuda.memory.CUDAPluggableAllocator over the C shim built
    by make), so the plugin's capacity, peak and plan cover every device byte.
    Call it before the first CUDA allocation (before model.to("cuda")); it
    refuses when CUDA is already initialised or there is no CUDA device. Then
    wrap(model, config=<the same INI>) as on the CPU, with the inputs on the
    device; the model runs on protrain.torch.stream(), which init makes current.
    Rank and world come from the launcher's variables, as in wrap."""
    _log.setup()
    _cuda.init(config, plugin, device, _adapter._launcher_rank)


def stream():
    """The CUDA stream the plugin was given (None before init)."""
    s = _cuda.session()
    return None if s is None else s.stream


def wrap(model, config="path.ini", blocks=None, lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
         weight_decay=0.0, max_grad_norm=0.0, grad_accum=1, plugin="protrain", state_dir=None,
         plan_shape=None):
    """Hand `model`'s parameters, gradients and activations to the plugin.

    config: the plugin's INI file (None: $PROTRAIN_CONFIG, else built-in
    defaults). blocks: the module list whose items are the blocks (None: found
    in Hugging Face causal LMs). The optimizer settings become the plugin's
    AdamW; grad_accum forward/backward passes make one optimizer step. plugin:
    a path or short name (found like every host finds it). state_dir: where the
    optimizer's state_dict() and load_state_dict() make their scratch folders
    (removed after each; None: the temporary directory). max_grad_norm > 0
    clips every step in the plugin; to clip from the training loop instead
    (torch.nn.utils.clip_grad_norm_, what the Hugging Face Trainer calls), leave
    it 0. The plugin plans at the first forward, with that forward's batch;
    plan_shape=(batch, sequence) plans for at least that shape from the start
    (the largest the run will see: then no later batch needs a new profile).
    Returns (model, optimizer)."""
    _model.refuse_parallel_wrappers(model)
    if getattr(model, "_protrain", None) is not None:
        raise ValueError("protrain.torch.wrap: this model is already wrapped")
    if blocks is None:
        blocks = _model.find_blocks(model)
    if len(blocks) == 0:
        raise ValueError("protrain.torch.wrap: blocks is empty")
    if int(grad_accum) < 1:
        raise ValueError("protrain.torch.wrap: grad_accum must be >= 1, got %r" % (grad_accum,))
    if config is not None and not os.path.isfile(config):
        raise ValueError("protrain.torch.wrap: config file %s does not exist" % config)
    optim = dict(lr=float(lr), betas=(float(betas[0]), float(betas[1])), eps=float(eps),
                 weight_decay=float(weight_decay), max_grad_norm=float(max_grad_norm))
    sess = _cuda.session()
    if sess is not None:
        if sess.adapter is not None:
            raise ValueError("protrain.torch.wrap: the CUDA context of protrain.torch.init "
                             "already serves a wrapped model; one model per process on cuda")
        if config is not None and os.path.abspath(config) != sess.config:
            raise ValueError("protrain.torch.wrap: config %s differs from the one given to "
                             "protrain.torch.init (%s); on cuda the plugin reads its INI at "
                             "init" % (config, sess.config))
    plan_shape = _adapter.check_plan_shape(plan_shape)
    _log.setup()
    ad = _adapter.Adapter(model, blocks, config, optim, grad_accum, plugin, sess)
    ad.plan_shape = plan_shape
    trainable = [info.param for info in ad.infos if info.trainable]
    if not trainable:
        raise ValueError("protrain.torch.wrap: the model has no trainable parameter")
    opt = Optimizer(ad, trainable, lr, betas, eps, weight_decay, state_dir)
    ad.optimizer = opt
    model._protrain = ad
    return model, opt


def _adapter_of(model):
    ad = getattr(model, "_protrain", None)
    if ad is None:
        raise ValueError("protrain.torch: the model was not wrapped by protrain.torch.wrap")
    return ad


def declare_step(model, n_micro, shapes=()):
    """Declare the next optimizer step before its first forward: n_micro
    forward/backward passes, 1 <= n_micro <= wrap's grad_accum (an epoch's
    short last step), and the (batch, sequence) shapes of its micro-batches, so the
    plan grows to the largest before the first pass. It holds for that step
    only. protrain.hf does this for the Trainer, which fetches each step's
    micro-batches up front."""
    _adapter_of(model).declare_step(n_micro, [None if s is None else tuple(s) for s in shapes])


def state_dict(model):
    """The model's state dict with dense copies of every parameter read from
    the plugin (read_param). model.state_dict() gives the same through its
    hooks (_saves.py); this one does not depend on them."""
    ad = _adapter_of(model)
    out = {}
    raw, ad.raw_state_dict = ad.raw_state_dict, True
    try:
        sd = model.state_dict(keep_vars=True)
    finally:
        ad.raw_state_dict = raw
    cache = {}
    for k, v in sd.items():
        i = ad.index.get(id(v))
        if i is None:
            out[k] = v.detach()
        else:
            if i not in cache:
                cache[i] = ad.read_param(i)
            out[k] = cache[i]
    return out


def unwrap(model):
    """Give the model back as it was before wrap: its own forward, no hook of
    the wrap left, and every parameter an ordinary tensor holding the trained
    values (on the CPU). The plugin's context is finalized; the optimizer wrap
    returned is unusable after. The model can be wrapped again."""
    ad = _adapter_of(model)
    ad.uninstall()
    finalize(model)
    del model._protrain
    return model


def stats(model):
    """The plugin's counters (pt_stats_v1) for a wrapped model."""
    return _adapter_of(model).ctx.stats()


def finalize(model):
    """Free every byte the plugin holds for this model (the model is unusable after)."""
    ad = _adapter_of(model)
    if ad.session is not None:      # torch's later frees must not reach a dead context
        ad.session.shim.point_at(None, -1)
    ad.ctx.finalize()
