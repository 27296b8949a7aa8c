"""The ctypes mirrors have the C header's layout: a C program compiled against
host_api/protrain.h prints every mirrored struct's size and each field's
offset, and both must equal what ctypes computes."""
import ctypes as C
import os
import shutil
import subprocess

import pytest

from conftest import ROOT
from protrain import _abi as A

C_NAMES = {"pt_plugin_v1": "pt_plugin_v1"}


def _program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "protrain.h"',
             "int main(void) {"]
    for s in A.MIRRORED:
        n = s.__name__
        lines.append('  printf("%s sizeof %%zu\\n", sizeof(%s));' % (n, n))
        for f in s._fields_:
            lines.append('  printf("%s %s %%zu\\n", offsetof(%s, %s));' % (n, f[0], n, f[0]))
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _c_layout(tmp_path):
    """sizeof and every field's offsetof of the mirrored structs, as the C
    compiler lays them out from host_api/protrain.h."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler to build the layout probe")
    src = tmp_path / "layout.c"
    src.write_text(_program())
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "host_api"),
                    str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    c_side = {}
    for line in out.splitlines():
        n, f, v = line.split()
        c_side[(n, f)] = int(v)
    return c_side


def _drifts(mirrors, c_side):
    """Where the ctypes mirrors (name -> Structure) differ from the C layout:
    (struct, field or "sizeof", C's number, the mirror's), and how many fields
    were compared."""
    out, checked = [], 0
    for n, s in mirrors.items():
        if c_side[(n, "sizeof")] != C.sizeof(s):
            out.append((n, "sizeof", c_side[(n, "sizeof")], C.sizeof(s)))
        have = {f[0] for f in s._fields_}
        for (cn, f), v in c_side.items():
            if cn != n or f == "sizeof":
                continue
            checked += 1
            got = getattr(s, f).offset if f in have else None
            if got != v:
                out.append((n, f, v, got))
    return out, checked


def test_struct_layout_matches_header(tmp_path):
    drifts, checked = _drifts({s.__name__: s for s in A.MIRRORED}, _c_layout(tmp_path))
    assert not drifts, drifts
    assert checked > 100


def test_layout_probe_catches_a_drift(tmp_path):
    """The comparison above is not vacuous: the same C layout against the
    adapter's mirrors with pt_optim_v1 drifted (its eps field dropped, so every
    later field moves) is reported, naming the struct and the fields."""
    fields = [f for f in A.pt_optim_v1._fields_ if f[0] != "eps"]
    Short = type("pt_optim_v1", (C.Structure,), {"_fields_": fields})
    mirrors = {s.__name__: s for s in A.MIRRORED}
    mirrors["pt_optim_v1"] = Short
    drifts, _ = _drifts(mirrors, _c_layout(tmp_path))
    named = {(n, f) for n, f, _, _ in drifts}
    assert ("pt_optim_v1", "eps") in named and ("pt_optim_v1", "sizeof") in named, drifts
    assert all(n == "pt_optim_v1" for n, _ in named), drifts
