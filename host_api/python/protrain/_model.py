"""What the adapter registers with the plugin: the blocks, and each parameter
with its block, dtype, tie and trainable flag, checked before anything is
handed over."""
import ctypes as C

import torch

from . import _abi as A
from ._mem import DTYPES

# Where Hugging Face causal LMs keep their decoder blocks.
BLOCK_PATHS = ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers",
               "transformer.layers", "layers", "h")


def _get(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def find_blocks(model):
    """The module list whose items are the blocks (HF layouts, through a PEFT
    wrapper's base_model.model too), or a refusal naming what was tried."""
    roots = [model]
    base = _get(model, "base_model.model")
    if isinstance(base, torch.nn.Module):
        roots.append(base)
    for root in roots:
        for path in BLOCK_PATHS:
            m = _get(root, path)
            if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and len(m) > 0:
                return m
    raise ValueError(
        "protrain.torch.wrap: no recognisable blocks in %s (looked for a non-empty module list "
        "at %s); pass blocks=<the module list whose items are the blocks>"
        % (type(model).__name__, ", ".join(BLOCK_PATHS)))


def refuse_parallel_wrappers(model):
    names = {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"}
    if type(model).__name__ in names:
        raise ValueError(
            "protrain.torch.wrap: the model is wrapped in %s; the plugin synchronises gradients "
            "across ranks itself, so pass the bare model (rank and world size come from the "
            "launcher's environment)" % type(model).__name__)


class ParamInfo:
    __slots__ = ("name", "param", "block", "trainable", "shape")

    def __init__(self, name, param, block, trainable):
        self.name, self.param, self.block, self.trainable = name, param, block, trainable
        self.shape = tuple(param.shape)


def collect(model, blocks, device=None):
    """[ParamInfo] in the model's order, one per distinct Parameter. A parameter
    reached from two blocks, or from a block and from outside the blocks, is
    refused: it would be used outside its block's window."""
    block_of_module = {}
    for b, blk in enumerate(blocks):
        for m in blk.modules():
            if id(m) in block_of_module and block_of_module[id(m)] != b:
                raise ValueError("protrain.torch.wrap: module %s is inside blocks %d and %d"
                                 % (type(m).__name__, block_of_module[id(m)], b))
            block_of_module[id(m)] = b
    where = {}   # id(param) -> set of blocks (-1 outside)
    first = {}   # id(param) -> (name, param)
    for mname, mod in model.named_modules(remove_duplicate=False):
        b = block_of_module.get(id(mod), -1)
        for pname, p in mod.named_parameters(recurse=False):
            full = "%s.%s" % (mname, pname) if mname else pname
            where.setdefault(id(p), set()).add(b)
            first.setdefault(id(p), (full, p))
    infos = []
    for pid, (name, p) in first.items():
        used = where[pid]
        if len(used) > 1:
            inside = sorted(x for x in used if x >= 0)
            what = ("blocks %s" % ", ".join(map(str, inside)) if -1 not in used else
                    "block %d and a module outside the blocks" % inside[0])
            raise ValueError(
                "protrain.torch.wrap: parameter %s is used by %s; a block's parameters are the "
                "plugin's only inside that block's window, so a shared one must live outside "
                "the blocks" % (name, what))
        (b,) = used
        if p.dtype not in DTYPES:
            raise ValueError("protrain.torch.wrap: parameter %s has dtype %s; the plugin takes "
                             "float32, bfloat16 or float16" % (name, p.dtype))
        if p.dim() > 4:
            raise ValueError("protrain.torch.wrap: parameter %s has %d dimensions; the ABI "
                             "describes at most 4" % (name, p.dim()))
        if p.device.type != "cpu" and (device is None or p.device != device):
            where = "the CPU" if device is None else "the CPU or %s" % device
            raise ValueError("protrain.torch.wrap: parameter %s is on %s; wrap the model on %s "
                             "(the plugin places every parameter itself)" % (name, p.device, where))
        infos.append(ParamInfo(name, p, b, bool(p.requires_grad)))
    return infos


def describe(infos):
    """The pt_param_v1 array and the host copies of the initial values (kept
    alive until post_model_load has read them)."""
    arr = (A.pt_param_v1 * len(infos))()
    keep = []
    for i, info in enumerate(infos):
        p = info.param.detach()
        init = p.to("cpu").contiguous().clone()   # the plugin reads init as host memory
        keep.append(init)
        name = info.name.encode()
        keep.append(name)
        d = arr[i]
        d.name = name
        d.dtype = DTYPES[p.dtype]
        shape = info.shape if len(info.shape) else (1,)
        d.ndim = len(shape)
        for k, s in enumerate(shape):
            d.shape[k] = s
        d.block = info.block
        d.trainable = 1 if info.trainable else 0
        d.tie = -1
        d.tp_split = 0
        d.init = C.c_void_p(init.data_ptr())
    return arr, keep


def buffers_to(model, device):
    """Move the model's buffers (rotary tables, masks) to the device; the
    parameters stay where they are until the plugin places them."""
    for mod in model.modules():
        for k, buf in list(mod._buffers.items()):
            if buf is not None and buf.device != device:
                mod._buffers[k] = buf.to(device)
