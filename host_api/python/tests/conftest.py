"""Shared set-up: the package on sys.path, the plugin from the build tree
(PT_BUILD, else <repo>/build), small seeded Hugging Face models."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "host_api", "python"))
BUILD = os.environ.get("PT_BUILD", os.path.join(ROOT, "build"))
PLUGIN = os.path.join(BUILD, "protrain_plugin.so")


@pytest.fixture
def plugin_path():
    if not os.path.exists(PLUGIN):
        pytest.fail("the plugin is not built: %s (run make)" % PLUGIN)
    return PLUGIN


@pytest.fixture
def ini(tmp_path):
    """ini(text) -> path of an INI with [plugin] backend = host and the given lines."""
    def make(extra="", name="t.ini"):
        p = tmp_path / name
        p.write_text("[plugin]\nbackend = host\nlog_level = error\n" + extra)
        return str(p)
    return make


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device and PT_TEST_DEVICE=cuda "
                            "(make test-gpu selects these with -k cuda)")
