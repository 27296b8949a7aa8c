"""The step schedule: the model's wrapped forward turns passes into pre_step
calls and optimizer.step() into optimizer_step/post_step.

Micro-batches: grad_accum = N forward/backward passes before optimizer.step()
are pre_step(step, m, N), m = 0..N-1; a forward with gradients disabled is an
evaluation pass, pre_step(step, -1, 0). A step of another count (an epoch's
short last step) is declared before its first forward (declare_step): its
passes are pre_step(step, m, n), and the plugin takes each step's n as given
(it accumulates when n > 1, and steps after the n-th pass).
"""
import warnings

import torch

from . import _acts
from ._recover import _what


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


class StepSchedule:
    """Mixin of Adapter: passes, micro-batches, the plan checks and the step."""

    # ---- the model's forward ----
    def forward(self, orig, args, kwargs):
        if self.recomputing is not None:
            return orig(*args, **kwargs)
        if self.profiling:
            self.training_pass = True
            self.learning = False
            return self._run_pass(orig, args, kwargs)
        if self.device is not None:
            self._check_stream()
        if not self.loaded:
            self._load(args, kwargs)
        self._recover_previous()
        self._check_dtypes()
        training = torch.is_grad_enabled()
        if training:
            kwargs = self.no_cache(kwargs)
            self._fit_shape(args, kwargs)
            n = self._step_n()
            if self.micro >= n:
                raise RuntimeError(
                    "protrain: forward pass %d of a step with grad_accum = %d%s; call "
                    "optimizer.step() after the step's %d forward/backward passes (or wrap with "
                    "the grad_accum your loop runs)" % (self.micro + 1, self.grad_accum,
                                                    " (declared: %d)" % n if self.declared else "",
                                                    n))
            step = self.step + 1 if self.micro == 0 else self.step
            self.call("pre_step", step, self.micro, n)
            self.step = step
            self.micro += 1
            self.just_dropped = False
        else:
            self.call("pre_step", self.step, -1, 0)
        # from here a pass is open in the plugin: a failure drops it (_recover)
        self.training_pass, self.in_pass = training, True
        try:
            if training:
                if self.micro == 1 and self._announce_clip():
                    self.lr_set = float(self.optimizer.param_groups[0]["lr"])
                    self.call("set_lr", self.lr_set)
                self._check_plan()
            return self._run_pass(orig, args, kwargs)
        except BaseException as e:
            if self.in_pass:
                self._discard(_what(training, e))
            raise

    def _run_pass(self, orig, args, kwargs):
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

    keep_cache = False     # the control: training passes keep use_cache

    def no_cache(self, kwargs):
        """A training pass runs without a KV cache: use_cache=False when the
        call or the model's config (transformers' default is True) asks for
        one. A recomputed (CKPT) block would append to the cache a second
        time, and training never reads it; generation (under no_grad) keeps
        it. A cache passed in (past_key_values) is still refused per block."""
        if self.keep_cache or kwargs.get("use_cache") is False:
            return kwargs
        if kwargs.get("use_cache") or getattr(getattr(self.model, "config", None), "use_cache",
                                              False):
            return dict(kwargs, use_cache=False)
        return kwargs

    def _check_previous_pass(self):
        """A training pass that never ended is dropped (_recover); one whose
        backward ended is closed."""
        self._recover_previous()
        if self.in_pass and self.training_pass:
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

    # ---- optimizer ----
    def optimizer_step(self, lr):
        if not self.loaded:
            raise RuntimeError("protrain: optimizer.step() before the first forward/backward")
        self._check_previous_pass()
        if self.micro == 0 and self.just_dropped:
            # the step's passes were dropped: nothing to step (as a GradScaler
            # skips a step whose gradients overflowed)
            self.just_dropped = False
            warnings.warn("protrain: optimizer.step() after its step was dropped: nothing to "
                          "step, skipped (the step number stays %d)" % (self.step + 1),
                          RuntimeWarning, stacklevel=3)
            return
        n = self._step_n()
        if self.micro != n:
            raise RuntimeError(
                "protrain: optimizer.step() after %d forward/backward passes; grad_accum = %d%s; "
                "a step of another count (an epoch's short last step) must be declared before "
                "its first forward with protrain.torch.declare_step(model, %d)"
                % (self.micro, self.grad_accum, " (declared: %d)" % n if self.declared else "",
                   self.micro))
        self.call("optimizer_step", float(lr))
        self.values_changed()
        if not self.clip_called:        # this step did not clip: the next announces nothing
            self.clip_max = None
        self.clip_called = False
        self.steps_run += 1
        self._unbind(self.nonblock)
        loss = self.loss_sum / self.loss_n if self.loss_n else float("nan")
        self.call("post_step", self.step, loss)
        self.micro, self.loss_sum, self.loss_n = 0, 0.0, 0
        self.declared = None

