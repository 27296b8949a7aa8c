"""protrain.hf: the Hugging Face Trainer (and TRL's trainers, which are Trainers).

    import protrain.hf
    model, optimizers = protrain.hf.wrap(model, args, config="train.ini")
    trainer = Trainer(model=model, args=args, optimizers=optimizers, ...)

or, for a Trainer built first (TRL's SFTTrainer, whose default loss patches
model.forward at construction; axolotl's plugin does the same):

    trainer = SFTTrainer(model=model, args=args, ...)
    protrain.hf.attach(trainer, config="train.ini")

wrap reads the optimizer settings from the TrainingArguments (learning_rate,
adam_beta1/2, adam_epsilon, weight_decay, max_grad_norm,
gradient_accumulation_steps) and returns (model, (optimizer, None)): the
Trainer builds its own lr scheduler (lr_scheduler_type, warmup) on the
plugin's optimizer, whose step() passes the scheduled lr to the plugin. The
Trainer's clip_grad_norm_ call reaches the plugin with the same max_grad_norm
(protrain.torch routes it), so clipping happens once and the logged grad_norm
is the plugin's. Checkpoints (save_steps, save_total_limit) save the model's
state_dict (the plugin's weights) and the optimizer's state_dict (the plugin's
state); resume_from_checkpoint loads both before the first forward.

What cannot work in the same Trainer is refused here with a sentence
(refusals()): DeepSpeed and FSDP shard the parameters the plugin owns;
gradient_checkpointing would recompute blocks outside the plugin's windows
(the plugin's CKPT mode is the checkpointing: [protrain] n_checkpoint in the
INI); fp16's GradScaler scales gradients the Trainer's optimizer never sees;
an optimizer other than AdamW; several processes (the Trainer would wrap the
model in DistributedDataParallel, whose all-reduce duplicates the plugin's);
weight decay, unless uniform_weight_decay=True (below).

Each step's micro-batches: the Trainer fetches all of an optimizer step's
micro-batches before the first (Trainer.get_batch_samples), fewer than
gradient_accumulation_steps at an epoch's end when its batch count is not a
multiple of it. wrap and attach hook that method (on the Trainer class, for
Trainers whose model is wrapped; attach also on the instance, for subclasses
that override it) and declare the step to the adapter
(protrain.torch.declare_step): its count, and its largest batch shape, which
the plan grows to before the first micro-batch.
"""
import functools
from collections.abc import Mapping

import protrain.torch as ptt
from protrain._schedule import _batch_shape

_ADAMW = ("adamw_torch", "adamw_torch_fused")


def _opt_name(args):
    o = getattr(args, "optim", "adamw_torch")
    return str(getattr(o, "value", o))


def _checkpointing(args):
    """transformers >= 5.24 names it activation_checkpointing (gradient_checkpointing
    is its deprecated alias); older versions only gradient_checkpointing."""
    if hasattr(type(args), "activation_checkpointing") or \
            "activation_checkpointing" in getattr(args, "__dict__", {}):
        return bool(args.activation_checkpointing)
    return bool(getattr(args, "gradient_checkpointing", False))


def refusals(args, uniform_weight_decay=False, built=False):
    """The sentences naming each TrainingArguments setting the plugin cannot
    serve inside a Trainer (empty when the arguments are fine). built: the
    Trainer exists already (attach), so its patches of model.forward are in."""
    out = []
    if not built and getattr(args, "loss_type", None) == "chunked_nll":
        out.append("loss_type='chunked_nll' (TRL's SFTConfig default): the SFTTrainer replaces "
                   "model.forward when it is built, which would unhook the plugin's forward; "
                   "build the SFTTrainer first and then call protrain.hf.attach(trainer, ...), "
                   "or set loss_type='nll'")
    if getattr(args, "deepspeed", None):
        out.append("deepspeed is set: DeepSpeed shards and steps the parameters the plugin "
                   "owns; use one or the other")
    if getattr(args, "fsdp", None):
        out.append("fsdp is set: FSDP shards the parameters the plugin owns; use one or the other")
    if _checkpointing(args):
        out.append("activation_checkpointing / gradient_checkpointing=True: the Trainer's "
                   "checkpointing would run each block a second time outside the plugin's "
                   "windows; the plugin checkpoints blocks itself (CKPT mode, chosen by its "
                   "planner or [protrain] n_checkpoint in the INI): set it to False")
    if getattr(args, "fp16", False):
        out.append("fp16=True: its GradScaler scales the loss and unscales gradients through the "
                   "optimizer's param groups, which hold no gradients under the plugin; use "
                   "bf16=True or fp32")
    name = _opt_name(args)
    if name not in _ADAMW:
        out.append("optim=%s: the plugin's optimizer is AdamW (optim=adamw_torch)" % name)
    if int(getattr(args, "world_size", 1)) > 1:
        out.append("world_size=%d: the Trainer would wrap the model in DistributedDataParallel, "
                   "whose gradient all-reduce duplicates the plugin's own, and it saves on rank 0 "
                   "only, while reading the weights or the optimizer state of a sharded run "
                   "(mode C) is a collective every rank must join (the others would wait "
                   "forever); run one process per rank with protrain.torch.wrap in your own "
                   "loop" % int(args.world_size))
    if float(getattr(args, "weight_decay", 0.0)) > 0 and not uniform_weight_decay:
        out.append("weight_decay=%g: the Trainer's AdamW leaves biases and norm weights "
                   "undecayed, the plugin's decays every parameter alike; pass "
                   "uniform_weight_decay=True to accept that, or weight_decay=0"
                   % float(args.weight_decay))
    return out


def _declare(trainer, batches):
    """Tell the trainer's wrapped model how many micro-batches this step runs
    and their shapes (batches: what get_batch_samples returned)."""
    ad = getattr(getattr(trainer, "model", None), "_protrain", None)
    if ad is None or not batches:
        return
    if len(batches) > ad.grad_accum:
        raise RuntimeError(
            "protrain.hf: the Trainer's step has %d micro-batches (gradient_accumulation_steps "
            "= %s), but the model was wrapped with grad_accum = %d; wrap it with "
            "protrain.hf.wrap(model, args), which takes the count from the arguments"
            % (len(batches), getattr(trainer.args, "gradient_accumulation_steps", "?"),
               ad.grad_accum))
    ad.declare_step(len(batches), [_batch_shape((), b) if isinstance(b, Mapping) else None
                                   for b in batches])


def _hooked(fetch):
    """fetch (get_batch_samples, bound or not) declaring each step it returns."""
    if getattr(fetch, "_protrain", False):
        return fetch

    @functools.wraps(fetch)
    def get_batch_samples(*a, **kw):
        out = fetch(*a, **kw)
        owner = getattr(fetch, "__self__", None)
        _declare(a[0] if owner is None else owner, out[0])
        return out
    get_batch_samples._protrain = True
    return get_batch_samples


def _hook_trainer_class():
    """transformers.Trainer.get_batch_samples declares each step to a wrapped
    model (a no-op for any other model). Without the method (transformers < 4.46)
    nothing is hooked: steps must then be of gradient_accumulation_steps passes
    and a longer micro-batch needs plan_shape (the adapter refuses otherwise)."""
    try:
        from transformers import Trainer
    except ImportError:
        return
    f = Trainer.__dict__.get("get_batch_samples")
    if f is not None:
        Trainer.get_batch_samples = _hooked(f)


def wrap(model, args, config=None, blocks=None, plugin="protrain", state_dir=None,
         uniform_weight_decay=False, plan_shape=None, _built=False):
    """protrain.torch.wrap with the optimizer settings of a TrainingArguments.
    Returns (model, (optimizer, None)) for Trainer(optimizers=...). Raises
    ValueError listing every setting the plugin cannot serve (refusals()).
    plan_shape=(batch, longest sequence): plan for that shape from the first
    forward (protrain.torch.wrap); not needed under the Trainer, whose steps
    are declared with their largest micro-batch (get_batch_samples above)."""
    bad = refusals(args, uniform_weight_decay, _built)
    if bad:
        raise ValueError("protrain.hf.%s: %s" % ("attach" if _built else "wrap", "; ".join(bad)))
    model, opt = ptt.wrap(model, config=config, blocks=blocks, lr=args.learning_rate,
                          betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                          weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
                          grad_accum=args.gradient_accumulation_steps, plugin=plugin,
                          state_dir=state_dir, plan_shape=plan_shape)
    _hook_trainer_class()
    return model, (opt, None)


def attach(trainer, config=None, blocks=None, plugin="protrain", state_dir=None,
           uniform_weight_decay=False, plan_shape=None):
    """Wrap a Trainer that is already built: its model goes to the plugin
    (wrap with trainer.args) and the plugin's optimizer becomes
    trainer.optimizer, on which the Trainer builds its scheduler at train().
    For trainers that patch model.forward when they are built (TRL's
    SFTTrainer with loss_type='chunked_nll'): the plugin's forward then wraps
    the patched one. Returns the trainer."""
    if getattr(trainer, "optimizer", None) is not None:
        raise ValueError("protrain.hf.attach: the Trainer already has an optimizer (%s); the "
                         "plugin's must be the only one (build the Trainer without optimizers=)"
                         % type(trainer.optimizer).__name__)
    _, (opt, _) = wrap(trainer.model, trainer.args, config=config, blocks=blocks, plugin=plugin,
                       state_dir=state_dir, uniform_weight_decay=uniform_weight_decay,
                       plan_shape=plan_shape, _built=True)
    trainer.optimizer = opt
    fetch = getattr(trainer, "get_batch_samples", None)
    if fetch is not None and not getattr(fetch, "_protrain", False):
        trainer.get_batch_samples = _hooked(fetch)
    return trainer
