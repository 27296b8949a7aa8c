"""Plugin memory seen as torch tensors, without copies.

On the host backend the simulated device's memory is ordinary host memory, so
a pointer the plugin hands out becomes a CPU tensor through a ctypes array and
torch.frombuffer. Views are cached by (address, bytes, dtype): the plugin
reuses a small set of buffers, and building a view costs more than a lookup.
"""
import ctypes as C

import torch

from . import _abi as A

DTYPES = {torch.float32: A.PT_F32, torch.bfloat16: A.PT_BF16, torch.float16: A.PT_F16}

_cache = {}
_CACHE_MAX = 8192


def flat(ptr, nbytes, dtype):
    """A 1-D tensor of `dtype` over nbytes at ptr (nbytes > 0)."""
    key = (ptr, nbytes, dtype)
    t = _cache.get(key)
    if t is None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        buf = (C.c_char * nbytes).from_address(ptr)
        t = torch.frombuffer(buf, dtype=dtype)
        _cache[key] = t
    return t


def view(ptr, dtype, shape):
    """A contiguous tensor of `shape` at ptr."""
    n = 1
    for s in shape:
        n *= s
    es = dtype.itemsize
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    return flat(ptr, n * es, dtype).view(shape)


def strided(ptr, dtype, span, shape, stride):
    """`span` elements at ptr seen with the given shape and strides."""
    es = dtype.itemsize
    if span == 0:
        return torch.empty(shape, dtype=dtype)
    return flat(ptr, span * es, dtype).as_strided(shape, stride)


def drop_cache():
    _cache.clear()
