"""Any batch shape trains: a plan holds every smaller batch, and a larger one
is planned for first (the plugin's replan, ABI 1.6).

The plan (chunk buffers, activation modes, predicted peak and times) is made
from a profile of one batch shape, batch x sequence (the first two dimensions
of input_ids, else inputs_embeds, else the first positional tensor). A
training batch no larger in either dimension needs no new plan: every
activation it saves is at most as large as the profiled one's (a block's
activations grow with batch x sequence, attention scores with batch x
sequence^2), so the plan's peak bounds it; its arenas are simply smaller.
This is what dynamic padding (each batch padded to its own longest sample), a
short last batch and a packed stream's short tail produce. A batch larger in
either dimension is profiled (profile_step on that batch, under a forked RNG
as at the first forward) and planned for before its pass starts, and its
shape becomes the plan's. When the device cannot hold it the plugin refuses
with the bytes it needed; the old plan stays, so smaller batches train on.

The shape planned for is the larger of the batch's and the plan's in each
dimension (alternating (8, 512) and (16, 256) plans once, for (16, 512)), and
at the first forward the larger of the batch's and wrap(plan_shape=) (the
largest shape the run will see, when the caller knows it: then no later
batch needs a profile). The profile runs on a batch of that shape made from
the real one by repeating its rows and its positions (every tensor argument
whose first two dimensions are the batch's: input_ids, attention_mask,
labels, inputs_embeds, position_ids), so every value is one the model
accepts; only its sizes matter to the profile. Cost: one profile (as at the
first forward) per growth; without plan_shape, put the largest batch first
(the HF Trainer's group_by_length does).

Inside an accumulation step the plan cannot change (the plugin re-plans only
between steps), so a micro-batch longer than the step's first is refused
unless the step was declared before its first forward (declare_step, which
protrain.hf calls with the batches the Trainer fetched for the step): the
plan then grows to the step's largest shape at its first micro-batch.

Evaluation passes take any shape: they hold no activations for backward.
"""
import torch

from ._log import logger
from ._plugin import Error
from ._schedule import _batch_shape, _shape_text


def check_plan_shape(shape):
    """wrap(plan_shape=): None, or (batch, sequence) of positive ints."""
    if shape is None:
        return None
    try:
        b, t = (int(v) for v in shape)
    except (TypeError, ValueError):
        b = t = 0
    if b < 1 or t < 1:
        raise ValueError("protrain.torch.wrap: plan_shape must be (batch, sequence) with both "
                         ">= 1, got %r" % (shape,))
    return (b, t)


def _grown(a, b):
    """The smallest shape holding both (per dimension); None when either is."""
    if a is None or b is None:
        return a if b is None else b
    return (max(a[0], b[0]), max(a[1], b[1]))


def _tile(t, shape, target):
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or tuple(t.shape[:2]) != shape:
        return t
    rows = torch.arange(target[0], device=t.device) % shape[0]
    cols = torch.arange(target[1], device=t.device) % shape[1]
    return t.detach().index_select(0, rows).index_select(1, cols)


def padded(args, kwargs, shape, target):
    """The forward's arguments with every tensor whose first two dimensions are
    `shape` repeated along them up to `target` (rows cycled, positions cycled)."""
    if shape is None or target == shape:
        return args, kwargs
    return (tuple(_tile(a, shape, target) for a in args),
            {k: _tile(v, shape, target) for k, v in kwargs.items()})


class ShapePlan:
    """Mixin of Adapter: the plan's batch shape, and planning for a larger one."""

    declared = None     # (n_micro, largest shape) of the step to come (declare_step)

    def declare_step(self, n_micro, shapes=()):
        """The next step runs n_micro <= grad_accum forward/backward passes
        (grad_accum when never declared), of the batch shapes `shapes`
        ((batch, sequence) or None each). Called between steps; it holds for
        that step only. The plan grows to the largest shape before the first
        pass, so a longer micro-batch later in the step needs no new plan."""
        n = int(n_micro)
        if not 1 <= n <= self.grad_accum:
            raise ValueError("protrain: declare_step: n_micro must be in [1, grad_accum = %d] "
                             "(a step runs at most wrap's grad_accum passes), got %r"
                             % (self.grad_accum, n_micro))
        if n != self.grad_accum and self.world > 1:
            # the plugin compares n_micro across ranks at the first step only; a
            # rank stepping after fewer passes would pair its gradient all-reduce
            # with another rank's next one
            raise ValueError("protrain: declare_step(%d) with %d ranks: every rank runs "
                             "grad_accum = %d passes per step (a short step on one rank "
                             "would meet the others' all-reduces out of step)"
                             % (n, self.world, self.grad_accum))
        if self.micro != 0:
            raise RuntimeError("protrain: declare_step inside a step (%d of its passes ran); "
                               "declare a step before its first forward" % self.micro)
        big = None
        for s in shapes:
            big = _grown(big, None if s is None else (int(s[0]), int(s[1])))
        self.declared = (n, big)

    def _step_n(self):
        return self.declared[0] if self.declared else self.grad_accum

    def _fits(self, shape):
        plan = self.shape
        if shape == plan:
            return True
        if self.frozen_shape or shape is None or plan is None:
            return False
        return shape[0] <= plan[0] and shape[1] <= plan[1]

    def _fit_shape(self, args, kwargs):
        shape = want = _batch_shape(args, kwargs)
        if self.declared and self.micro == 0 and shape is not None and not self.frozen_shape:
            want = _grown(shape, self.declared[1])     # the step's largest (declare_step)
        if self._fits(want):
            return
        if self.frozen_shape or shape is None or self.shape is None or \
                not self.table.has("replan"):
            why = ("the plugin has no replan hook (ABI 1.6)" if not self.table.has("replan")
                   else "the shape cannot be compared" if not self.frozen_shape
                   else "the shape is frozen")
            raise RuntimeError(
                "protrain: this training batch is %s, but the plan was profiled and made for %s; "
                "%s: keep the shape (pad or pack to the profiled length), or wrap the model "
                "again for the new shape" % (_shape_text(shape), _shape_text(self.shape), why))
        self._replan(shape, args, kwargs, want)

    def _first_shape(self, shape):
        """The shape the first forward plans for."""
        step = self.declared[1] if self.declared and shape is not None else None
        return _grown(_grown(shape, self.plan_shape), step)

    def _replan(self, shape, args, kwargs, want=None):
        old = self.shape
        target = _grown(want or shape, old)
        self.profile_args = padded(args, kwargs, shape, target)
        try:
            with torch.random.fork_rng(devices=self._rng_devices()):
                self.call("replan", target[0], target[1])
        except Error as e:
            self._reset_pass()
            cause = e.__cause__ if isinstance(e.__cause__, Error) else e
            hint = "" if self.micro == 0 else (
                "; a step's longest micro-batch must be known before its first: pass "
                "plan_shape=(batch, longest sequence) to wrap, or declare the step "
                "(protrain.torch.declare_step(model, n, shapes))")
            raise RuntimeError(
                "protrain: this training batch is %s, larger than the %s the plan was made for, "
                "and planning for %s failed: %s; the plan for %s stays in force (batches up to "
                "that shape train)%s" % (_shape_text(shape), _shape_text(old),
                                         _shape_text(target), cause.sentence, _shape_text(old),
                                         hint)) from e
        except BaseException:
            self._reset_pass()
            raise
        finally:
            self.profile_args = None
        self._reset_pass()          # the profile's passes are over
        self.shape = target
        self.plan_sig = None        # learn the activation modes of the new plan
        self.replans += 1
        logger.info("re-planned for %s (the plan was made for %s; the batch is %s)",
                    _shape_text(target), _shape_text(old), _shape_text(shape))
