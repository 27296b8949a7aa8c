"""A failed step recovers: the plugin's discard_step (ABI 1.6).

A training pass fails when its forward raises (a bad input, an exception in
any module), when its backward stops before the end (an exception from an
autograd node or a module's backward hook), or when its loss is dropped
without backward (the next forward or optimizer.step() comes first). A
forward's failure is caught where it happens; the other two are seen at the
next forward or optimizer.step(): the pass is still open, and either no
backward entered a block (bw_started is False) or the backward's end-of-pass
callback never ran (autograd drops queued callbacks when a backward raises).

Then discard_step drops the step in progress in the plugin: every
micro-batch since the last optimizer.step() (their gradients are summed in
place, so one cannot be taken out of the sum), its windows, arenas and
buffers. The adapter forgets the pass (parameter views, saved activations,
the block inputs kept for recompute) and the step counter goes back, so the
next forward starts the same step again: the run continues exactly as one
that never saw the dropped micro-batches. A RuntimeWarning names what
happened and what was dropped. An evaluation pass that raises is closed the
same way (it holds no gradient). The graph of a dropped pass is dead: calling
backward on its loss later reads placeholders and fails.

What the plugin cannot drop it refuses, and so does the adapter, with the
plugin's sentence: a step whose offloaded chunks the CPU optimizer already
stepped during its backward (set_lr gives the lr early so that those steps
overlap backward) has moved weights and moments; the run cannot go on from
there (load a saved state into a new wrap).
"""
import warnings

from . import _acts
from ._plugin import Error


def _what(training, exc):
    kind = "training" if training else "evaluation"
    return "the %s forward raised %s: %s" % (kind, type(exc).__name__, exc)


class StepRecovery:
    """Mixin of Adapter: dropping a failed pass and the step it belonged to."""

    def _pending_failure(self):
        """What went wrong with the previous training pass when it never
        ended, else None."""
        if not (self.in_pass and self.training_pass) or self.profiling:
            return None
        if not self.bw_started:
            return ("a training forward's loss was never back-propagated (the next forward or "
                    "optimizer.step() came first)")
        return ("the backward of a training forward stopped before it reached the first block "
                "(an exception raised inside it, or a backward of part of the graph)")

    def _recover_previous(self):
        what = self._pending_failure()
        if what is not None:
            self._discard(what)

    def _reset_pass(self):
        """The adapter's side of a pass forgotten: no window open, no saved
        activation, no kept block input."""
        for b in range(self.L):
            self._unbind(self.block_params[b])
        self._unbind(self.nonblock)
        self.in_pass = False
        self.training_pass = False
        self.bw_started = False
        self.next_fwd = 0
        self.next_bw = self.L - 1
        self.bw_open = -1
        self.cur_fwd = None
        self.count = [0] * self.L
        self.acts = [_acts.BlockActs(b) for b in range(self.L)]
        self.inputs = [None] * self.L
        self.rng = [None] * self.L
        self.amp = [None] * self.L
        self.recomputed = [False] * self.L
        if self.learning:       # the modes were being learned: learn them again
            self.learning = False
            self.plan_sig = None

    def _discard(self, what):
        training = self.training_pass
        step, n = self.step, self.micro
        if self.skip_discard:   # negative control: the old behaviour, nothing dropped
            return
        if not self.table.has("discard_step"):
            raise RuntimeError(
                "protrain: %s, and the plugin %s has no discard_step hook (ABI 1.6) to drop the "
                "step; the run cannot continue from it" % (what, self.table.version))
        try:
            self.call("discard_step")
        except Error as e:
            raise RuntimeError("protrain: %s, and the step cannot be dropped: %s"
                               % (what, e.sentence)) from e
        self._reset_pass()
        if training:     # the step had started: pre_step counted its first micro-batch
            self.step -= 1
            self.micro, self.loss_sum, self.loss_n, self.lr_set = 0, 0.0, 0, None
            self.clip_called = False
            self.dropped_steps += 1
            self.just_dropped = True
            msg = ("protrain: %s; step %d was dropped (%d micro-batch(es) since the last "
                   "optimizer.step(), this one included, with their gradients): weights and "
                   "optimizer state are as after step %d, and the next forward starts step %d "
                   "again" % (what, step, n, step - 1, step))
        else:
            msg = "protrain: %s; the evaluation pass was closed" % what
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
