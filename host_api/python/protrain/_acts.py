"""Activations a block saves for backward, kept in the plugin's arena.

During block b's forward a saved-tensors hook collects every tensor autograd
saves (the block's own parameters excepted: they are returned as they are, and
their .data is rebound at each window, so backward sees the plugin's copy).
At the block's forward post-hook the collected tensors are laid out one after
another (64-byte aligned, each with its own shape and strides), the arena is
asked for exactly that many bytes and the tensors are copied in; the torch
copies are then dropped. Asking at the end of the block, not before it, means
the arena always fits the batch that ran: a batch of another shape asks for
another size (what the plugin does with a size it did not profile is its own
rule; the adapter never guesses a size).

A handle (block, generation, index) stands for each saved tensor. Unpacking
reads the arena address the plugin gave after block_pre_backward(b) (it may have
moved the arena to pinned memory and back, SWAP, or freed and recomputed it,
CKPT) and views the tensor at its offset.
"""
import torch

from . import _mem

ALIGN = 64


def _span(shape, stride):
    """Elements a tensor's storage covers: 1 + sum((size-1)*stride), 0 when empty."""
    n = 1
    for s, st in zip(shape, stride):
        if s == 0:
            return 0
        n += (s - 1) * st
    return n


class Handle:
    __slots__ = ("block", "gen", "index")

    def __init__(self, block, gen, index):
        self.block, self.gen, self.index = block, gen, index


class BlockActs:
    """One block's saved tensors for the current micro-batch."""

    def __init__(self, block):
        self.block = block
        self.gen = 0
        self.pending = []        # tensors collected during the forward
        self.layout = []         # (offset, dtype, shape, stride, span)
        self.total = 0
        self.base = None         # arena address, valid in the backward window
        self.refill = None       # next index while a recompute refills the arena

    def begin(self):
        self.gen += 1
        self.pending = []
        self.layout = []
        self.total = 0
        self.base = None
        self.refill = None

    def add(self, t):
        self.pending.append(t)
        return Handle(self.block, self.gen, len(self.pending) - 1)

    def plan(self):
        """Offsets of the collected tensors; returns the arena bytes needed."""
        off = 0
        self.layout = []
        for i, t in enumerate(self.pending):
            if torch._debug_has_internal_overlap(t) != 0:
                t = t.contiguous()            # expanded views: store the values densely
                self.pending[i] = t
            shape, stride = tuple(t.shape), tuple(t.stride())
            span = _span(shape, stride)
            self.layout.append((off, t.dtype, shape, stride, span))
            off += (span * t.dtype.itemsize + ALIGN - 1) // ALIGN * ALIGN
        self.total = off
        return off

    def store(self, base):
        """Copy the collected tensors into the arena at base; drop the torch copies."""
        for t, (off, dtype, shape, stride, span) in zip(self.pending, self.layout):
            if span:
                _mem.strided(base + off, dtype, span, shape, stride).copy_(t)
        self.pending = []

    def view(self, h):
        if h.gen != self.gen:
            raise RuntimeError(
                "protrain: a tensor block %d saved in an earlier forward pass was used by this "
                "backward (one backward per forward: the plugin holds one pass's activations)"
                % self.block)
        if self.base is None:
            raise RuntimeError(
                "protrain: block %d's saved activations were used outside its backward window "
                "(between block_pre_backward and block_post_backward)" % self.block)
        off, dtype, shape, stride, span = self.layout[h.index]
        if span == 0:
            return _mem.empty(shape, dtype)
        return _mem.strided(self.base + off, dtype, span, shape, stride)

    def refill_one(self, t):
        """During a recompute: write the i-th saved tensor again at its offset."""
        i = self.refill
        if i >= len(self.layout):
            raise RuntimeError(
                "protrain: the recompute of block %d saved more tensors than its forward did (%d); "
                "the block's forward must be deterministic in what it saves (a KV cache passed "
                "through kwargs, use_cache=True, changes it)" % (self.block, len(self.layout)))
        off, dtype, shape, stride, span = self.layout[i]
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise RuntimeError(
                "protrain: the recompute of block %d saved tensor %d as %s %s, its forward saved "
                "%s %s" % (self.block, i, t.dtype, tuple(t.shape), dtype, shape))
        if span:
            _mem.strided(self.base + off, dtype, span, shape, stride).copy_(t)
        self.refill = i + 1
