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


def test_struct_layout_matches_header(tmp_path):
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
    checked = 0
    for s in A.MIRRORED:
        n = s.__name__
        assert c_side[(n, "sizeof")] == C.sizeof(s), n
        for f in s._fields_:
            assert c_side[(n, f[0])] == getattr(s, f[0]).offset, (n, f[0])
            checked += 1
    assert checked > 100


def test_layout_probe_catches_a_drift():
    """The comparison is not vacuous: a mirror with one field removed differs."""
    fields = [f for f in A.pt_optim_v1._fields_ if f[0] != "eps"]
    Short = type("Short", (C.Structure,), {"_fields_": fields})
    assert C.sizeof(Short) != C.sizeof(A.pt_optim_v1)
