"""protrain.torch.init's refusals, which hold on any machine (the names avoid
the word the GPU runner selects with -k, so these run in make test)."""
import pytest
import torch

import protrain.torch as pt
from protrain import _cuda
from protrain import _mem


@pytest.fixture(autouse=True)
def no_session():
    assert _cuda.session() is None
    yield
    assert _cuda.session() is None and _mem._device is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_init_without_device_refuses(ini):
    with pytest.raises(RuntimeError, match="no CUDA device"):
        pt.init(ini())


def test_init_after_device_started_refuses(ini, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA is already initialised.*before the first CUDA "
                                           "allocation"):
        pt.init(ini())


def test_init_bad_arguments_refused(ini):
    with pytest.raises(ValueError, match="config file .* does not exist"):
        pt.init("/nonexistent/x.ini")
    with pytest.raises(ValueError, match="init is for a CUDA device"):
        pt.init(ini(), device="cpu")


def test_device_view_interface():
    """The description torch.as_tensor reads for a device pointer: bytes as
    uint8 at the address, read-write, no stream (checked here without a GPU;
    the tensor itself is built only on cuda)."""
    d = _mem.DeviceBytes(0x7F0000001000, 4096).__cuda_array_interface__
    assert d["shape"] == (4096,) and d["typestr"] == "|u1"
    assert d["data"] == (0x7F0000001000, False) and d["version"] == 2
    assert d["strides"] is None and "stream" not in d
