"""torch.nn.utils.clip_grad_norm_ on a wrapped model's parameters goes to the
plugin (the clip_grad_norm hook): outside their windows a block's parameters
have no gradient, so torch's own function would see only the non-block ones
(the wrong norm) and clip those alone.

The plugin's CPU optimizer steps offloaded chunks during backward once set_lr
has told it the lr, so it must know before backward that a step clips. The
adapter learns it from its first step (a resumed run's too): that step gives no set_lr (every CPU
step waits for optimizer_step), and a clip_grad_norm_ call in it is
remembered; from then on each step announces the clipping right after
pre_step (the hook with no norm), so the CPU steps wait for the norm while
the rest still overlaps. A step that clips after steps that did not is refused
by the plugin (its chunks already stepped) with a sentence.

Calls whose parameters are none of a wrapped model's pass through to torch;
norm_type other than 2 is refused (the plugin computes the L2 norm);
max_norm = inf asks for the norm only (torch's idiom); a max_norm differing
from wrap(max_grad_norm=...) is refused (the plugin would clip twice).
"""
import ctypes as C
import math
import weakref

import torch

from ._plugin import Error

_adapters = weakref.WeakSet()
_orig = {}


def install(ad):
    """Route clip_grad_norm_ through the plugin for this adapter's parameters."""
    _adapters.add(ad)
    if _orig:
        return
    import torch.nn.utils as U
    import torch.nn.utils.clip_grad as CG
    _orig["fn"] = CG.clip_grad_norm_
    U.clip_grad_norm_ = CG.clip_grad_norm_ = clip_grad_norm_


def forget(ad):
    _adapters.discard(ad)


def _owner(params):
    """The adapter whose parameters these are, or None when none is wrapped."""
    found = None
    for p in params:
        for ad in list(_adapters):
            i = ad.index.get(id(p))
            if i is not None and ad.infos[i].param is p:
                if found is not None and found is not ad:
                    raise ValueError("protrain: clip_grad_norm_ got the parameters of two "
                                     "wrapped models; clip each model's parameters apart")
                found = ad
                break
        else:
            if found is not None and p.requires_grad:
                raise ValueError("protrain: clip_grad_norm_ mixes a wrapped model's parameters "
                                 "with others; the plugin's norm covers only its own")
    return found


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    ad = _owner(params)
    if ad is None or ad.clip_passthrough:
        return _orig["fn"](params, max_norm, norm_type, error_if_nonfinite, foreach)
    norm = ad.clip_grad_norm(params, float(max_norm), float(norm_type))
    if error_if_nonfinite and not math.isfinite(norm):
        raise RuntimeError("The total norm of order %g for gradients from `parameters` is "
                           "non-finite, so it cannot be clipped." % float(norm_type))
    return torch.tensor(norm, dtype=torch.float32)


class Clipping:
    """Mixin of Adapter: the clip_grad_norm hook, learned and announced."""

    clip_max = None          # the max norm of the last step's call (inf: norm only)
    steps_run = 0            # optimizer steps this adapter ran (a resumed run counts anew)
    clip_passthrough = False  # the control: torch's own function (the partial clip)

    def _announce_clip(self):
        """At micro-batch 0 after pre_step: set_lr lets the CPU step offloaded
        chunks during backward, so it is given only once the first step has
        shown whether the steps clip; a clipping run announces it first."""
        if not self.steps_run or not self.table.has("set_lr"):
            return False
        if self.clip_max is not None and self.table.has("clip_grad_norm"):
            mx = 0.0 if math.isinf(self.clip_max) else self.clip_max
            self.call("clip_grad_norm", C.c_float(mx), None)
        return True

    def clip_grad_norm(self, params, max_norm, norm_type):
        if norm_type != 2.0:
            raise ValueError("protrain: clip_grad_norm_ with norm_type=%g; the plugin computes "
                             "the global L2 norm (norm_type=2) only" % norm_type)
        if math.isnan(max_norm) or max_norm <= 0:
            raise ValueError("protrain: clip_grad_norm_ with max_norm=%g would zero every "
                             "gradient; pass max_norm > 0, or float('inf') for the norm only"
                             % max_norm)
        mine = sum(1 for info in self.infos if info.trainable)
        given = {id(p) for p in params}
        missing = [info.name for info in self.infos
                   if info.trainable and id(info.param) not in given]
        if missing:
            raise ValueError("protrain: clip_grad_norm_ got %d of the model's %d trainable "
                             "parameters (not %s); the plugin's norm is over all of them"
                             % (mine - len(missing), mine, missing[0]))
        conf = self.optim["max_grad_norm"]
        if conf > 0 and not math.isinf(max_norm) and max_norm != conf:
            raise ValueError("protrain: clip_grad_norm_(max_norm=%g) on a model wrapped with "
                             "max_grad_norm=%g, which already clips every step; give one of "
                             "them (clipping twice would shrink the step twice)"
                             % (max_norm, conf))
        if not self.table.has("clip_grad_norm"):
            raise RuntimeError("protrain: the plugin %s has no clip_grad_norm hook (ABI 1.6); "
                               "clip with wrap(max_grad_norm=...) instead" % self.table.path)
        if not self.loaded or self.micro != self._step_n():
            raise RuntimeError("protrain: clip_grad_norm_ after %d of the step's %d "
                               "forward/backward passes; call it after the last backward, "
                               "before optimizer.step() (a step of another count than "
                               "grad_accum is declared first: protrain.torch.declare_step)"
                               % (self.micro, self._step_n()))
        self._check_previous_pass()
        norm = C.c_double()
        mx = 0.0 if math.isinf(max_norm) else max_norm
        try:
            self.call("clip_grad_norm", C.c_float(mx), C.byref(norm))
        except Error as e:
            if e.status_name == "PT_ERR_ORDER":
                raise RuntimeError(
                    "protrain: clip_grad_norm_ in step %d, but the steps before it did not "
                    "clip, so the plugin's CPU optimizer already stepped this step's offloaded "
                    "chunks with the unclipped gradient; clip in every step from the first, or "
                    "in none (%s)" % (self.step, e.sentence)) from e
            raise
        self.clip_max = max_norm
        self.clip_called = True
        return norm.value
