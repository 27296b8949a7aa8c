"""Saves and loads through the model's own state-dict paths.

Outside its windows a parameter's .data is a NaN placeholder of its shape
(_windows._placeholder), so torch's own state_dict would save NaN. A state-dict
post-hook on every module that owns a parameter replaces each of its entries
with a dense copy of the plugin's value (read_param), so model.state_dict()
(any prefix, keep_vars, a nested submodule's state_dict), torch.save of it and
Hugging Face save_pretrained (which calls state_dict) write the trained
weights. A parameter reached under two names (tied weights) gets one copy
for both, so savers that detect shared storage see the tie. Copies are cached
while someone holds them and dropped at every change (an optimizer step, a
load), so a save reads each parameter once.

Loads: before the first forward the parameters are still ordinary tensors
(the plugin copies them at post_model_load), so load_state_dict writes them
as in plain PyTorch and the plugin starts from the loaded values. After it, a
load-state-dict pre-hook writes each loaded value into the plugin
(write_param: the compute copy and a 16-bit parameter's fp32 master; the
optimizer's moments stay, as torch's load leaves its optimizer alone) and
lends the parameter a host copy for torch's own copy_ to land in, which a
post-hook swaps back for the placeholder. Between steps only: inside a step
the load is refused. assign=True is refused always: it would replace the
Parameter objects the plugin's windows rebind.
"""
import ctypes as C
import weakref

import torch

from ._windows import _placeholder


class Saves:
    """Mixin of Adapter: state-dict hooks that read and load through the plugin."""

    def _install_saves(self):
        """One state-dict post-hook and one load pre-hook per module that owns
        a wrapped parameter (directly, so nested state_dict calls see them)."""
        self.index = {id(info.param): i for i, info in enumerate(self.infos)}
        self.read_cache = weakref.WeakValueDictionary()
        self.raw_state_dict = False   # protrain.torch.state_dict and the control
        for mod in self.model.modules():
            if any(id(p) in self.index for p in mod._parameters.values() if p is not None):
                self.handles.append(mod.register_state_dict_post_hook(
                    lambda m, d, p, meta: self._state_dict_hook(m, d, p, meta)))
                self.handles.append(mod.register_load_state_dict_pre_hook(
                    lambda *a: self._load_hook(*a)))
                self.handles.append(mod.register_load_state_dict_post_hook(
                    lambda m, keys: self._after_load()))
        self.lent = []   # parameters lent a host copy during a load

    def values_changed(self):
        """The plugin's values moved (a step, a load): cached copies are stale."""
        self.read_cache = weakref.WeakValueDictionary()

    def read_value(self, i):
        """The plugin's value of parameter i, one copy per change (see values_changed)."""
        t = self.read_cache.get(i)
        if t is None:
            t = self.read_param(i)
            self.read_cache[i] = t
        return t

    def _state_dict_hook(self, mod, dest, prefix, meta):
        if not self.loaded or self.raw_state_dict:
            return
        for name, p in mod._parameters.items():
            i = self.index.get(id(p)) if p is not None else None
            key = prefix + name
            if i is None or key not in dest:
                continue
            t = self.read_value(i)
            if dest[key] is p:          # keep_vars=True: a Parameter, as asked
                t = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            dest[key] = t

    def _load_hook(self, mod, sd, prefix, meta, strict, missing, unexpected, errors):
        names = [prefix + n for n, p in mod._parameters.items()
                 if p is not None and id(p) in self.index and prefix + n in sd]
        if not names:
            return
        if meta.get("assign_to_params_buffers"):
            raise RuntimeError(
                "protrain: load_state_dict(assign=True) would replace %s with new Parameter "
                "objects, which the plugin's windows do not know; load without assign (the "
                "values are copied in)" % names[0])
        if not self.loaded:
            return                      # ordinary tensors: torch copies into them
        if self.micro or self.in_pass:
            raise RuntimeError(
                "protrain: load_state_dict reaches %s inside a training step (after %d of its "
                "forward/backward passes); load between optimizer.step() and the next forward"
                % (names[0], self.micro))
        if not self.table.has("write_param"):
            raise RuntimeError(
                "protrain: load_state_dict reaches %s after the first forward, and the plugin "
                "%s has no write_param hook (ABI 1.6) to take the values; load before the "
                "first forward" % (names[0], self.table.path))
        for name, p in mod._parameters.items():
            key = prefix + name
            i = self.index.get(id(p)) if p is not None else None
            v = sd.get(key) if i is not None else None
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != self.infos[i].shape:
                continue                # torch reports a missing or misshapen entry
            src = v.detach().to(device="cpu", dtype=p.dtype).contiguous()
            self.call("write_param", i, C.c_void_p(src.data_ptr()),
                      src.numel() * src.element_size())
            p.data = src                # torch's own copy_ lands here
            self.lent.append(i)
        self.values_changed()

    def _after_load(self):
        lent, self.lent = self.lent, []
        for i in lent:
            info = self.infos[i]
            info.param.data = _placeholder(info.param.dtype, info.shape)
