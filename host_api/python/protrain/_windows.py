"""Parameter windows (protrain.h, host contract 2): a block's parameters point
into the plugin's storage only between block_pre_forward/block_post_forward
and between block_pre_backward/block_post_backward; outside them .data is a
placeholder of the parameter's shape whose every element is one shared NaN
(_placeholder), so a stray read computes NaN instead of stale weights and a
stray write raises. Saves read the plugin's values instead (_saves.py).
Non-block parameters are bound from the start of a pass (pre_step) to
optimizer_step (an evaluation pass: to the end of the forward).

The saved-tensors hooks live here too: a saved parameter, or a view of one,
must be re-made at the address the parameter has in the backward window.
"""
import ctypes as C

import torch

from . import _acts
from . import _mem

_NAN = {}


def _placeholder(dtype, shape):
    """What a parameter's .data is outside its windows: its shape, dtype and
    device over one shared NaN element (a zero-stride view, no memory), so
    numel(), shapes, model.device and parameter counts stay the model's, a
    computation that reads it gives NaN (never stale weights) and an in-place
    write raises (every element is one memory location)."""
    key = (dtype, _mem._device, shape)
    t = _NAN.get(key)
    if t is None:
        one = _NAN.get(key[:2])
        if one is None:
            one = _NAN[key[:2]] = torch.full((), float("nan"), dtype=dtype, device=_mem._device)
        # one expanded view per shape, kept: every window's end assigns it
        t = _NAN[key] = one.expand(shape)
    return t


class ParamWindows:
    """Mixin of Adapter: binding parameters to plugin memory, the saved-tensor
    hooks, reading a parameter back."""

    # ---- parameter windows ----
    def _bind(self, idx, grads):
        infos, params, view = self.infos, self.params, _mem.view
        for i in idx:
            info = infos[i]
            d = params[i]
            p = info.param
            ptr = d.data
            if ptr is None:
                raise RuntimeError("protrain: the plugin gave no address for %s inside its window"
                                   % info.name)
            p.data = view(ptr, p.dtype, info.shape)
            if grads and info.trainable:
                ptr = d.grad
                if ptr is None:
                    raise RuntimeError("protrain: the plugin gave no gradient address for %s"
                                       % info.name)
                p.grad = view(ptr, p.dtype, info.shape)

    def _unbind(self, idx):
        infos = self.infos
        for i in idx:
            info = infos[i]
            p = info.param
            p.grad = None
            p.data = _placeholder(p.dtype, info.shape)

    # ---- saved tensors ----
    cur_fwd = None
    param_ptrs = {}
    # ids of the parameters bound in the current window (_bound_ptrs's, rebuilt
    # at each block's forward and recompute): a saved tensor that is one of
    # them is kept as it is
    param_ids = frozenset()

    def _pack(self, t):
        if self.recomputing is not None:
            b = self.recomputing
            if id(t) not in self.param_ids and \
                    t.untyped_storage().data_ptr() not in self.param_ptrs:
                self.acts[b].refill_one(t)
            return None
        b = self.cur_fwd
        if b is None or id(t) in self.param_ids:
            return t
        i = self.param_ptrs.get(t.untyped_storage().data_ptr())
        if i is not None:
            return _acts.ParamView(i, t)
        acts = self.acts[b]
        if acts.mode is _acts.REF:
            acts.add(t, copy=False)
            return t
        return acts.add(t, copy=acts.mode is _acts.COPY)

    def _unpack(self, h):
        cls = type(h)
        if cls is _acts.Handle:
            return self.acts[h.block].view(h)
        if isinstance(h, torch.Tensor):
            return h
        if cls is _acts.ParamView:
            blk = self.infos[h.index].block
            ptr = self.params[h.index].data
            if ptr is None or (blk >= 0 and blk != self.bw_open):
                raise RuntimeError(
                    "protrain: a saved view of %s (block %d) was used outside its backward "
                    "window (between block_pre_backward and block_post_backward)"
                    % (self.infos[h.index].name, blk))
            return h.view(ptr)
        return h

    def _bound_ptrs(self, b):
        """Address -> parameter index for the parameters bound in block b's window
        (its own and the non-block ones): a saved tensor on one of these storages
        is a view of that parameter."""
        self.param_ptrs = {self.params[i].data: i for i in self.block_params[b]}
        self.param_ptrs.update((self.params[i].data, i) for i in self.nonblock)
        self.param_ptrs.pop(None, None)
        self.param_ids = {id(self.infos[i].param) for i in self.block_params[b]}
        self.param_ids.update(id(self.infos[i].param) for i in self.nonblock)

    def read_param(self, i):
        info = self.infos[i]
        if not self.loaded:
            return info.param.detach().clone()
        out = torch.empty(info.shape, dtype=info.param.dtype)
        self.call("read_param", i, C.c_void_p(out.data_ptr()),
                  out.numel() * out.element_size())
        return out
