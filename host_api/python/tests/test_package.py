"""pip install of host_api/python (pyproject.toml) into a throwaway target
folder (offline: --no-deps --no-build-isolation --no-index), then a Python
started outside the source tree, with only that folder on its path, imports
protrain, protrain.torch, protrain.hf and protrain.axolotl from it, finds the
plugin the documented ways, and trains one step (the first case; the others
only look for the plugin):

- installed library directory: a protrain.pc (what `make install` writes)
  on PKG_CONFIG_PATH names a libdir holding protrain_plugin.so;
- $PROTRAIN_PLUGIN_PATH: takes precedence over that libdir;
- control: with neither, the short name is not found, and the error names
  where it looked (skipped where a plugin is installed system-wide).
"""
import os
import shutil
import subprocess
import sys

from conftest import PLUGIN, ROOT

SCRIPT = r"""
import os, sys
import protrain
site = sys.argv[1]
try:
    t = protrain.Table("protrain")
except protrain.Error as e:
    print("NOTFOUND", e.sentence)
    sys.exit(0)
print("PLUGIN", t.path)
if sys.argv[3] != "full":
    sys.exit(0)
import protrain.torch, protrain.hf, protrain.axolotl
for m in (protrain, protrain.torch, protrain.hf, protrain.axolotl):
    assert os.path.realpath(m.__file__).startswith(os.path.realpath(site)), m.__file__
import torch
torch.manual_seed(0)
blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = blocks
    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return x
m, opt = protrain.torch.wrap(M(), config=sys.argv[2], blocks=blocks, lr=1e-2)
x = torch.randn(4, 3, 8)
before = protrain.torch.state_dict(m)["layers.0.weight"].clone()
m(x).square().mean().backward()
opt.step()
after = protrain.torch.state_dict(m)["layers.0.weight"]
assert not torch.equal(before, after)
print("STEPPED")
"""


def _install(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "host_api", "python"), src,
                    ignore=shutil.ignore_patterns("tests", "bench", "__pycache__", "*.egg-info",
                                                  "build"))
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index", "--target", str(site), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "protrain" / "hf.py").exists() and (site / "protrain" / "axolotl.py").exists()
    return site


def _run(tmp_path, site, ini, full=False, **env_extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PROTRAIN_PLUGIN_PATH", "PKG_CONFIG_PATH")}
    env.update(PYTHONPATH=str(site), **env_extra)
    out = tmp_path / "cwd"
    out.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(site), ini,
                        "full" if full else "find"], cwd=out, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _libdir(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    os.symlink(PLUGIN, d / "protrain_plugin.so")
    return d


def test_pip_install_and_plugin_search(tmp_path, ini):
    site = _install(tmp_path)
    conf = ini("[protrain]\nforce_all_persistent = true\n")
    lib = _libdir(tmp_path, "lib")
    pc = tmp_path / "pkgconfig"
    pc.mkdir()
    (pc / "protrain.pc").write_text(
        "prefix=%s\nlibdir=%s\nincludedir=%s/include\n\nName: protrain\nDescription: test\n"
        "Version: 1\nCflags: -I${includedir}\nLibs: -L${libdir} -lprotrain_loader -ldl\n"
        % (tmp_path, lib, tmp_path))
    out = _run(tmp_path, site, conf, full=True, PKG_CONFIG_PATH=str(pc))
    assert "PLUGIN %s/protrain_plugin.so" % lib in out and "STEPPED" in out, out

    envlib = _libdir(tmp_path, "envlib")
    out = _run(tmp_path, site, conf, PKG_CONFIG_PATH=str(pc), PROTRAIN_PLUGIN_PATH=str(envlib))
    assert "PLUGIN %s/protrain_plugin.so" % envlib in out, out

    system = [d for d in ("/usr/local/lib", "/usr/lib") if
              os.path.exists(os.path.join(d, "protrain_plugin.so"))]
    if not system and shutil.which("pkg-config"):
        empty = tmp_path / "nopc"
        empty.mkdir()
        out = _run(tmp_path, site, conf, PKG_CONFIG_PATH=str(empty), PKG_CONFIG_LIBDIR=str(empty))
        assert "NOTFOUND" in out and "PROTRAIN_PLUGIN_PATH" in out, out
