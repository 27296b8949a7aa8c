"""Finding the plugin (path, short name through $PROTRAIN_PLUGIN_PATH), the
table's hooks, and protrain.Error carrying the status name and sentence."""
import ctypes as C
import os

import pytest

import protrain
from protrain import _abi as A


def test_path_and_short_name(plugin_path, monkeypatch):
    t = protrain.Table(plugin_path)
    assert t.name == "protrain" and t.has("init") and t.has("dist_allreduce")
    monkeypatch.setenv("PROTRAIN_PLUGIN_PATH", "/nonexistent:" + os.path.dirname(plugin_path))
    t2 = protrain.Table("protrain")
    assert os.path.samefile(t2.path, plugin_path)


def test_missing_file_is_an_error():
    with pytest.raises(protrain.Error) as e:
        protrain.Table("/nonexistent/protrain_plugin.so")
    assert e.value.status_name == "PT_ERR_IO" and "not found" in e.value.sentence


def test_not_a_plugin(tmp_path):
    import _ctypes   # any shared object that is not a plugin
    with pytest.raises(protrain.Error) as e:
        protrain.Table(_ctypes.__file__)
    assert e.value.status_name == "PT_ERR_FORMAT"


def test_bad_config_gives_the_plugins_sentence(plugin_path, tmp_path):
    ini = tmp_path / "bad.ini"
    ini.write_text("[plugin]\nbackend = host\nno_such_key = 1\n")
    t = protrain.Table(plugin_path)
    h = A.pt_host_v1()
    h.abi_version, h.struct_size, h.world_size = A.ABI_VERSION, C.sizeof(h), 1
    with pytest.raises(protrain.Error) as e:
        protrain.Context(t, str(ini), h)
    assert e.value.status_name == "PT_ERR_CONFIG"
    assert "no_such_key" in e.value.sentence
    assert str(e.value).startswith("init: PT_ERR_CONFIG: ")


def test_a_hook_out_of_order(plugin_path, ini):
    t = protrain.Table(plugin_path)
    h = A.pt_host_v1()
    h.abi_version, h.struct_size, h.world_size = A.ABI_VERSION, C.sizeof(h), 1
    ctx = protrain.Context(t, ini(), h)
    with pytest.raises(protrain.Error) as e:
        ctx.call("pre_step", 0, 0, 1)
    assert e.value.status == A.PT_ERR_ORDER and e.value.hook == "pre_step"
    ctx.finalize()
