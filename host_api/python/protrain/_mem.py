"""Plugin memory seen as torch tensors, without copies.

On the host backend the simulated device's memory is ordinary host memory, so
a pointer the plugin hands out becomes a CPU tensor through a ctypes array and
torch.frombuffer. On cuda (set_device) a pointer becomes a CUDA tensor through
__cuda_array_interface__: the bytes are described as uint8 (the interface has
no type string for bfloat16) and reinterpreted with Tensor.view(dtype), which
copies nothing. Views are cached by (address, bytes, dtype): the plugin
reuses a small set of buffers, and building a view costs more than a lookup.
"""
import ctypes as C

import torch

from . import _abi as A

DTYPES = {torch.float32: A.PT_F32, torch.bfloat16: A.PT_BF16, torch.float16: A.PT_F16}

_cache = {}
_shaped = {}        # (address, dtype, shape) -> view(): a window's rebinding looks it up
_CACHE_MAX = 8192
_device = None      # None: host backend (CPU tensors); else the torch.device of cuda


class DeviceBytes:
    """nbytes of device memory at ptr, in the form torch.as_tensor reads
    (version 2 of the CUDA array interface: no stream, so torch inserts no
    synchronisation; the plugin orders its work against the host's stream)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (int(nbytes),), "typestr": "|u1", "data": (int(ptr), False),
            "strides": None, "version": 2}


def set_device(device):
    """Views from now on are CUDA tensors on `device` (None: CPU tensors)."""
    global _device
    _device = device
    drop_cache()


def empty(shape, dtype):
    return torch.empty(shape, dtype=dtype, device=_device)


def flat(ptr, nbytes, dtype):
    """A 1-D tensor of `dtype` over nbytes at ptr (nbytes > 0)."""
    key = (ptr, nbytes, dtype)
    t = _cache.get(key)
    if t is None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        if _device is None:
            buf = (C.c_char * nbytes).from_address(ptr)
            t = torch.frombuffer(buf, dtype=dtype)
        else:
            t = torch.as_tensor(DeviceBytes(ptr, nbytes), device=_device).view(dtype)
        _cache[key] = t
    return t


def view(ptr, dtype, shape):
    """A contiguous tensor of `shape` at ptr. Cached like flat(): a parameter
    is rebound at every window of every step, mostly to the same address."""
    key = (ptr, dtype, shape)
    t = _shaped.get(key)
    if t is not None:
        return t
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return empty(shape, dtype)
    if len(_shaped) >= _CACHE_MAX:
        _shaped.clear()
    t = _shaped[key] = flat(ptr, n * dtype.itemsize, dtype).view(shape)
    return t


def strided(ptr, dtype, span, shape, stride):
    """`span` elements at ptr seen with the given shape and strides."""
    es = dtype.itemsize
    if span == 0:
        return empty(shape, dtype)
    return flat(ptr, span * es, dtype).as_strided(shape, stride)


def drop_cache():
    _cache.clear()
    _shaped.clear()
