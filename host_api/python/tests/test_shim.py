"""The CUDAPluggableAllocator shim, driven directly through ctypes against a
plugin context on the host backend: torch would call exactly these two
functions, so this checks the routing into the plugin's accounting without a
GPU (the CUDA calls of torch itself are not exercised here)."""
import ctypes as C
import os

import pytest

import protrain
from protrain import _abi as A
from protrain import _cuda
from conftest import BUILD

MIB = 1 << 20


@pytest.fixture
def routed(plugin_path, ini):
    path = os.path.join(BUILD, _cuda.SHIM)
    if not os.path.exists(path):
        pytest.fail("the allocator shim is not built: %s (run make)" % path)
    shim = _cuda.Shim(path)
    tbl = protrain.Table(plugin_path)
    h = A.pt_host_v1()
    h.abi_version, h.struct_size, h.world_size = A.ABI_VERSION, C.sizeof(h), 1
    ctx = protrain.Context(tbl, ini("[memory]\ndevice_capacity = 8MiB\n"), h)
    shim.point_at(ctx, 0)
    yield shim, ctx
    shim.point_at(None, -1)
    ctx.finalize()


def test_shim_alloc_counts_in_plugin(routed):
    shim, ctx = routed
    before, n0 = ctx.stats(), shim.failures()
    p = shim.alloc(3 * MIB, 0)
    assert p, ctx.tbl.last_error(ctx.ctx)
    C.memset(p, 0x5A, 3 * MIB)          # the bytes are usable (host backend memory)
    mid = ctx.stats()
    assert mid.dev_current - before.dev_current >= 3 * MIB
    assert mid.dev_peak >= mid.dev_current
    shim.free(p, 3 * MIB, 0)
    after = ctx.stats()
    assert after.dev_current == before.dev_current
    assert after.dev_peak == mid.dev_peak
    assert shim.failures() == n0


def test_shim_over_capacity_returns_null(routed):
    shim, ctx = routed
    n0 = shim.failures()
    cap = ctx.stats().dev_capacity
    assert cap > 0
    assert shim.alloc(cap + MIB, 0) is None
    assert shim.failures() == n0 + 1
    assert "out of memory" in ctx.tbl.last_error(ctx.ctx)   # the plugin's sentence stays
    # the plugin still serves a request that fits
    p = shim.alloc(MIB, 0)
    assert p
    shim.free(p, MIB, 0)


def test_shim_refuses_other_device_and_unset(routed):
    shim, ctx = routed
    n0 = shim.failures()
    assert shim.alloc(MIB, 1) is None          # the context serves device 0 only
    assert shim.failures() == n0 + 1
    cur = ctx.stats().dev_current
    shim.point_at(None, -1)
    assert shim.alloc(MIB, 0) is None          # no context: refused, nothing counted
    assert shim.failures() == n0 + 2
    shim.point_at(ctx, 0)
    assert ctx.stats().dev_current == cur


def test_shim_zero_bytes_and_null_free(routed):
    shim, ctx = routed
    cur, n0 = ctx.stats().dev_current, shim.failures()
    assert shim.alloc(0, 0) is None
    shim.free(None, 0, 0)
    assert ctx.stats().dev_current == cur
    assert shim.failures() == n0
