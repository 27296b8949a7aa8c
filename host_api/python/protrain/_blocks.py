"""Block hooks: the forward and backward windows of each block.

Backward order: block_pre_backward(b) runs in the block's full backward
pre-hook, when the gradient of its output is complete. block_post_backward(b)
waits for two things: every trainable parameter of the block has had its
gradient accumulated (post-accumulate-grad hooks, counted per block), and the
gradient has left the block (block b-1's backward pre-hook, or the end of the
backward pass). A count alone is not enough: a norm's weight gradient lands
before the norm's remaining backward nodes, which still read the block's saved
tensors. A block autograd never enters (frozen, with an input that needs no
gradient) gets its two hooks when the pass moves past it.
"""
import ctypes as C

import torch

from . import _acts
from . import _mem


class BlockHooks:
    """Mixin of Adapter: block_pre/post_forward and block_pre/post_backward."""

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
                        "protrain: block %d got a KV cache (%s) in a training pass; training "
                        "passes run without one (the wrap turns use_cache off in them), so pass "
                        "no past_key_values: a recomputed block would append to the cache"
                        % (b, k))
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

