"""Hook installation: the model's forward is replaced by the adapter's, and
each block gets its forward pre/post hooks, its full backward pre-hook and its
parameters' post-accumulate-grad hooks; uninstall undoes all of it
(protrain.torch.unwrap)."""
import functools

from . import _clip


class HookInstall:
    """Mixin of Adapter: installs the module and autograd hooks."""

    # ---- hooks ----
    def _install(self):
        model, ad = self.model, self
        orig = model.forward

        # the original's name, docstring and signature (inspect follows
        # __wrapped__): trainers read the forward's parameters to pick columns
        @functools.wraps(orig)
        def forward(*args, **kwargs):
            return ad.forward(orig, args, kwargs)

        self._orig_forward = orig
        self._own_forward = "forward" in model.__dict__   # an instance attribute before wrap
        model.forward = forward
        self.handles = []
        for b, blk in enumerate(self.blocks):
            self.handles.append(blk.register_forward_pre_hook(
                lambda m, a, k, b=b: ad.block_pre_forward(b, m, a, k), with_kwargs=True))
            self.handles.append(blk.register_forward_hook(
                lambda m, a, k, o, b=b: ad.block_post_forward(b, m, a, k, o), with_kwargs=True))
            self.handles.append(blk.register_full_backward_pre_hook(
                lambda m, g, b=b: ad.block_pre_backward(b, m, g)))
            for i in self.block_params[b]:
                if self.infos[i].trainable:
                    self.handles.append(self.infos[i].param.register_post_accumulate_grad_hook(
                        lambda p, b=b: ad.grad_accumulated(b)))
        self._install_saves()
        _clip.install(self)

    unwrap_skip_rebind = False   # the control: leave the placeholders in place

    def uninstall(self):
        """Undo the wrap: every hook removed, the model's own forward back, and
        each parameter an ordinary tensor holding the plugin's current value
        (read before the context goes; CPU tensors)."""
        values = None
        if self.loaded and not self.unwrap_skip_rebind:
            values = [self.read_param(i) for i in range(len(self.infos))]
        for h in self.handles:
            h.remove()
        self.handles = []
        _clip.forget(self)
        if self._own_forward:
            self.model.forward = self._orig_forward
        else:
            del self.model.forward
        for i, info in enumerate(self.infos):
            info.param.grad = None
            if values is not None:
                info.param.data = values[i]
