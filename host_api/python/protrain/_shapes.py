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

Cost: one profile (as at the first forward) per growth. The plan's shape
only grows per dimension for a new batch larger in both; a batch larger in
one dimension and smaller in the other is planned at its own shape, so
alternating between (8, 512) and (16, 256) re-plans each time: put the
largest batch first (the HF Trainer's group_by_length does), or keep the
batch size fixed.

Evaluation passes take any shape: they hold no activations for backward.
"""
import logging

import torch

from ._plugin import Error
from ._schedule import _batch_shape, _shape_text

_log = logging.getLogger("protrain")


class ShapePlan:
    """Mixin of Adapter: the plan's batch shape, and planning for a larger one."""

    def _fits(self, shape):
        plan = self.shape
        if shape == plan:
            return True
        if self.frozen_shape or shape is None or plan is None:
            return False
        return shape[0] <= plan[0] and shape[1] <= plan[1]

    def _fit_shape(self, args, kwargs):
        shape = _batch_shape(args, kwargs)
        if self._fits(shape):
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
        self._replan(shape, args, kwargs)

    def _replan(self, shape, args, kwargs):
        old = self.shape
        self.profile_args = (args, kwargs)
        try:
            with torch.random.fork_rng(devices=self._rng_devices()):
                self.call("replan", shape[0], shape[1])
        except Error as e:
            self._reset_pass()
            cause = e.__cause__ if isinstance(e.__cause__, Error) else e
            raise RuntimeError(
                "protrain: this training batch is %s, larger than the %s the plan was made for, "
                "and planning for it failed: %s; the plan for %s stays in force (batches up to "
                "that shape train)" % (_shape_text(shape), _shape_text(old), cause.sentence,
                                       _shape_text(old))) from e
        except BaseException:
            self._reset_pass()
            raise
        finally:
            self.profile_args = None
        self._reset_pass()          # the profile's passes are over
        self.shape = shape
        self.plan_sig = None        # learn the activation modes of the new plan
        self.replans += 1
        _log.info("protrain: re-planned for %s (the plan was made for %s)",
                  _shape_text(shape), _shape_text(old))
