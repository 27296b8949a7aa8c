"""model.to(dtype), .half(), .bfloat16(), .float(), .double() after wrap.

The plugin stores each parameter in the dtype it had at wrap: its chunks,
gradients and optimizer state are laid out for it, and the adapter views the
plugin's bytes as that dtype inside each window. A conversion after wrap
would only change the placeholders the parameters hold between windows, and
the next window would view fp32 bytes as fp16 (garbage, NaN). So a
conversion that changes any parameter's dtype is refused before it changes
anything (every module's _apply is guarded, so model.model.half() is caught
too), and a forward checks the dtypes once more (a parameter's .data
reassigned by hand). A call that changes no dtype (model.float() of an fp32
model, model.to(device) on its own device) passes.
"""
import torch


def _name(dt):
    return str(dt).replace("torch.", "")


class DtypeGuard:
    """Mixin of Adapter: refusing a dtype conversion after wrap."""

    def _install_dtype_guard(self):
        self.wrap_dtypes = [info.param.dtype for info in self.infos]
        kinds = sorted(set(self.wrap_dtypes), key=str)
        ad = self
        for mod in self.model.modules():
            orig = mod._apply

            def guarded(fn, *a, _orig=orig, **k):
                ad._check_apply(fn, kinds)
                return _orig(fn, *a, **k)
            mod._apply = guarded

    def _check_apply(self, fn, kinds):
        for dt in kinds:
            out = fn(torch.empty(0, dtype=dt))
            if isinstance(out, torch.Tensor) and out.dtype != dt:
                raise RuntimeError(
                    "protrain: converting the wrapped model's parameters from %s to %s is "
                    "refused and nothing changed: the plugin holds them as %s (its chunks, "
                    "gradients and optimizer state are laid out for it); convert the model "
                    "before protrain.torch.wrap, or compute in lower precision with "
                    "torch.autocast" % (_name(dt), _name(out.dtype), _name(dt)))

    def _check_dtypes(self):
        for info, dt in zip(self.infos, self.wrap_dtypes):
            if info.param.dtype != dt:
                raise RuntimeError(
                    "protrain: parameter %s is %s, but it was %s when the model was wrapped and "
                    "the plugin holds it as %s; its dtype cannot change after wrap (convert "
                    "before protrain.torch.wrap)" % (info.name, _name(info.param.dtype),
                                                     _name(dt), _name(dt)))
