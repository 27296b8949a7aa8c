"""Recompute (CKPT): re-running a block inside its backward with the random
state and the autocast state its forward began with."""
import contextlib
import ctypes as C

import torch

from . import _acts


class Recompute:
    """Mixin of Adapter: random and autocast state per block, recompute_block."""

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

