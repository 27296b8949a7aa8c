"""The oracle on a CUDA device: GPT-2 and Llama (the tiny configs of
oracle.py), resident and streamed, through the plugin with every torch CUDA
allocation routed to it (protrain.torch.init), against plain PyTorch on the
same device in the same process: step-1 loss bit-identical, losses within 1e-5
relative, weights within 1e-5 in relative norm (the CPU oracle's bounds; TF32
is off by torch's default for matmuls, so both sides compute in fp32). Each run
is its own process, since torch's allocator is replaced once per process.

Marked `cuda` and run only with PT_TEST_DEVICE=cuda on a machine with a CUDA
device (make test-gpu); elsewhere they are reported as skipped."""
import json
import os
import subprocess
import sys

import pytest
import torch

from test_oracle import RESIDENT, STREAMED, check

HERE = os.path.dirname(os.path.abspath(__file__))
WANTED = os.environ.get("PT_TEST_DEVICE") == "cuda"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not WANTED, reason="CUDA tests run with PT_TEST_DEVICE=cuda"),
    pytest.mark.skipif(WANTED and not torch.cuda.is_available(),
                       reason="PT_TEST_DEVICE=cuda but torch sees no CUDA device"),
]

CASES = {"resident": RESIDENT, "streamed": STREAMED}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_cuda_oracle(kind, case, tmp_path, plugin_path):
    ini = tmp_path / "cuda.ini"
    ini.write_text("[plugin]\nbackend = cuda\nlog_level = error\n" + CASES[case])
    env = dict(os.environ, PROTRAIN_PLUGIN_PATH=os.path.dirname(plugin_path))
    r = subprocess.run([sys.executable, os.path.join(HERE, "cuda_worker.py"), kind, str(ini)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(res)
    assert res["routed"] >= 1 << 20, "a torch CUDA tensor did not show in the plugin's counters"
    assert res["failures"] == 0, "the allocator shim refused or failed a request"
    # no peak bound here: the reference's bytes went through the plugin's counters too
    check(res["got"], res["want"], res["err"])
