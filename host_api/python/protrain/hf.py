"""protrain.hf: the Hugging Face Trainer (and TRL's trainers, which are Trainers).

    import protrain.hf
    model, optimizers = protrain.hf.wrap(model, args, config="train.ini")
    trainer = Trainer(model=model, args=args, optimizers=optimizers, ...)

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
"""
import protrain.torch as ptt

_ADAMW = ("adamw_torch", "adamw_torch_fused")


def _opt_name(args):
    o = getattr(args, "optim", "adamw_torch")
    return str(getattr(o, "value", o))


def refusals(args, uniform_weight_decay=False):
    """The sentences naming each TrainingArguments setting the plugin cannot
    serve inside a Trainer (empty when the arguments are fine)."""
    out = []
    if getattr(args, "deepspeed", None):
        out.append("deepspeed is set: DeepSpeed shards and steps the parameters the plugin "
                   "owns; use one or the other")
    if getattr(args, "fsdp", None):
        out.append("fsdp is set: FSDP shards the parameters the plugin owns; use one or the other")
    if getattr(args, "gradient_checkpointing", False):
        out.append("gradient_checkpointing=True: the Trainer's checkpointing would recompute "
                   "blocks outside the plugin's windows; the plugin checkpoints blocks itself "
                   "(CKPT mode, chosen by its planner or [protrain] n_checkpoint in the INI): "
                   "set gradient_checkpointing=False")
    if getattr(args, "fp16", False):
        out.append("fp16=True: its GradScaler scales the loss and unscales gradients through the "
                   "optimizer's param groups, which hold no gradients under the plugin; use "
                   "bf16=True or fp32")
    name = _opt_name(args)
    if name not in _ADAMW:
        out.append("optim=%s: the plugin's optimizer is AdamW (optim=adamw_torch)" % name)
    if int(getattr(args, "world_size", 1)) > 1:
        out.append("world_size=%d: the Trainer would wrap the model in DistributedDataParallel, "
                   "whose gradient all-reduce duplicates the plugin's own; run one process per "
                   "rank with protrain.torch.wrap in your own loop" % int(args.world_size))
    if float(getattr(args, "weight_decay", 0.0)) > 0 and not uniform_weight_decay:
        out.append("weight_decay=%g: the Trainer's AdamW leaves biases and norm weights "
                   "undecayed, the plugin's decays every parameter alike; pass "
                   "uniform_weight_decay=True to accept that, or weight_decay=0"
                   % float(args.weight_decay))
    return out


def wrap(model, args, config=None, blocks=None, plugin="protrain", state_dir=None,
         uniform_weight_decay=False):
    """protrain.torch.wrap with the optimizer settings of a TrainingArguments.
    Returns (model, (optimizer, None)) for Trainer(optimizers=...). Raises
    ValueError listing every setting the plugin cannot serve (refusals())."""
    bad = refusals(args, uniform_weight_decay)
    if bad:
        raise ValueError("protrain.hf.wrap: " + "; ".join(bad))
    model, opt = ptt.wrap(model, config=config, blocks=blocks, lr=args.learning_rate,
                          betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                          weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
                          grad_accum=args.gradient_accumulation_steps, plugin=plugin,
                          state_dir=state_dir)
    return model, (opt, None)
