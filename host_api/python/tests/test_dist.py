"""2 ranks under mpirun (rank and world from Open MPI's variables; the plugin
all-reduces the gradients) against 1 rank with grad_accum = 2 on the same
micro-batches: the mean of the ranks' losses and the final weights agree
within 1e-6."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import oracle
import protrain.torch as ptt
from conftest import HERE

STEPS = 4
INI = "[dist]\nbackend = mpi\n[protrain]\nforce_all_persistent = true\n"


def test_two_ranks_vs_grad_accum(ini, plugin_path, tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("mpirun is not installed (make deps installs openmpi-bin)")
    path = ini(INI)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([mpirun, "--oversubscribe", "--allow-run-as-root", "-np", "2",
                        sys.executable, os.path.join(HERE, "dist_worker.py"), path, plugin_path,
                        str(tmp_path), str(STEPS)], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    ranks = [json.load(open(tmp_path / ("rank%d.json" % k))) for k in (0, 1)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    two = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]
    m, one = oracle.through_plugin(oracle.make_model("gpt2"), ini(INI, name="one.ini"),
                                   oracle.batches(2 * STEPS), grad_accum=2, plugin=plugin_path)
    for a, b in zip(two, one):
        assert abs(a - b) <= 1e-6 * abs(b), (two, one)
    err = oracle.rel_norm(torch.load(tmp_path / "weights.pt"), ptt.state_dict(m))
    assert err <= 1e-6, err
