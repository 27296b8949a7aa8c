"""Hook installation: the model's forward is replaced by the adapter's, and
each block gets its forward pre/post hooks, its full backward pre-hook and its
parameters' post-accumulate-grad hooks."""
import functools

from . import _clip


class HookInstall:
    """Mixin of Adapter: installs the module and autograd hooks."""

    # ---- hooks ----
    def _install(self):
        model, ad = self.model, self
        orig = model.forward

        # the model's own signature (inspect follows __wrapped__): the HF
        # Trainer's remove_unused_columns keeps only the dataset columns the
        # forward names, and with a bare (*args, **kwargs) it drops input_ids
        @functools.wraps(orig)
        def forward(*args, **kwargs):
            return ad.forward(orig, args, kwargs)

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
