"""Activations a block saves for backward, kept in the plugin's arena.

During block b's forward a saved-tensors hook collects every tensor autograd
saves, parameters excepted: a parameter is returned as it is (its .data is
rebound at each window, so backward sees the plugin's copy), and a view of a
parameter's storage (linear layers save weight.t()) becomes a ParamView,
which unpacking re-makes at the address the parameter has in the backward
window (the plugin may have moved the chunk; the values are the same, as
nothing steps the weights between a forward and its backward).
Each collected tensor gets an offset (64-byte aligned, each with its own shape
and strides; an expanded view is laid out densely), and at the block's forward
post-hook the arena is asked for exactly that many bytes: a batch of another
shape asks for another size (a smaller batch than the plan's, a smaller
arena; a larger one is planned for first, see _shapes.py).

What happens to the tensors themselves depends on the block's activation mode
under the plan (BlockActs.mode, learned by the adapter from the plugin's own
behaviour on the first training pass of a plan):
  COPY (mode not known yet, a SWAP block, and always on cuda): the tensors are
      copied into the arena and the torch copies dropped; a handle stands for
      each one, and unpacking views it at the address activation_arena_get
      gives after block_pre_backward(b) (SWAP moves the arena to pinned memory
      and back, so only what is in the arena survives).
  REF (a NONE block, host backend): the arena stays where it is from the
      forward to the backward, so nothing needs to move: autograd keeps the
      tensors as in plain PyTorch and the arena is only asked for (the plugin's
      accounting and plan still see the block's activation bytes). The copy
      would cost a pass over every saved byte per block per step.
  META (a CKPT block): the plugin frees the arena at block_post_forward and
      recomputes it before the block's backward, so the forward's tensors are
      dropped at once (only their layout is kept). The recompute's tensors are
      checked against that layout and kept until the block's
      block_post_backward, which unpacking returns; the arena the plugin
      allocated for the recompute does not move within the backward window, so
      as for REF nothing needs copying into it.
"""
import torch

from . import _mem

ALIGN = 64
COPY, REF, META = None, "ref", "meta"


def _span(shape, stride):
    """Elements a tensor's storage covers: 1 + sum((size-1)*stride), 0 when empty."""
    n = 1
    for s, st in zip(shape, stride):
        if s == 0:
            return 0
        n += (s - 1) * st
    return n


def _dense_stride(shape):
    st, out = 1, []
    for s in reversed(shape):
        out.append(st)
        st *= max(s, 1)
    return tuple(reversed(out))


class Handle:
    __slots__ = ("block", "gen", "index")

    def __init__(self, block, gen, index):
        self.block, self.gen, self.index = block, gen, index


class ParamView:
    """A saved tensor that views parameter `index`'s storage at byte `off`."""
    __slots__ = ("index", "off", "dtype", "shape", "stride", "span")

    def __init__(self, index, t):
        self.index, self.dtype = index, t.dtype
        self.off = t.storage_offset() * t.dtype.itemsize
        self.shape, self.stride = tuple(t.shape), tuple(t.stride())
        self.span = _span(self.shape, self.stride)

    def view(self, ptr):
        return _mem.strided(ptr + self.off, self.dtype, self.span, self.shape, self.stride)


class BlockActs:
    """One block's saved tensors for the current micro-batch."""

    def __init__(self, block):
        self.block = block
        self.gen = 0
        self.mode = COPY
        self.pending = []        # (layout index, tensor) to copy into the arena
        self.layout = []         # (offset, dtype, shape, stride, span)
        self.total = 0
        self.base = None         # arena address, valid in the backward window
        self.refill = None       # next index while a recompute refills the arena
        self.kept = []           # META: the recompute's tensors, in layout order

    def begin(self, mode=COPY):
        self.gen += 1
        self.mode = mode
        self.pending = []
        self.layout = []
        self.total = 0
        self.base = None
        self.refill = None
        self.kept = []

    def add(self, t, copy=True):
        """Lay out one saved tensor at the next offset; keep it for the copy when asked."""
        shape = tuple(t.shape)
        if torch._debug_has_internal_overlap(t) != 0:
            stride = _dense_stride(shape)     # expanded views: store the values densely
        else:
            stride = tuple(t.stride())
        span = _span(shape, stride)
        self.layout.append((self.total, t.dtype, shape, stride, span))
        self.total += (span * t.dtype.itemsize + ALIGN - 1) // ALIGN * ALIGN
        if copy:
            self.pending.append((len(self.layout) - 1, t))
        return Handle(self.block, self.gen, len(self.layout) - 1)

    def plan(self):
        """The arena bytes the collected tensors need."""
        return self.total

    def store(self, base):
        """Copy the collected tensors into the arena at base; drop the torch copies."""
        for i, t in self.pending:
            off, dtype, shape, stride, span = self.layout[i]
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
        if self.mode is META:
            if len(self.kept) != len(self.layout):
                raise RuntimeError(
                    "protrain: block %d is checkpointed, but its saved tensors were used before "
                    "its recompute" % self.block)
            return self.kept[h.index]
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
        if self.mode is META:
            self.kept.append(t)
        elif span:
            _mem.strided(self.base + off, dtype, span, shape, stride).copy_(t)
        self.refill = i + 1
