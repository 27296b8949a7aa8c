"""One rank of the torchrun run (started by test_torchrun.py): rank r trains
on micro-batch 2s+r of step s, once per run given as VARIANT:INI (each a
fresh model and plugin context over the same process group, which the first
wrap initialises from torchrun's variables); writes each run's losses, mode
and final weights.

VARIANT `lonely` plays a host whose collectives move nothing: its
all_to_all hands every rank only its own blocks, so each rank's part of every
all-reduce holds its own gradient alone (the negative control); `ok` is the
real one."""
import ctypes as C
import json
import os
import sys
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import oracle  # noqa: E402
import protrain.torch as ptt  # noqa: E402


def lonely(self, send, recv, n):
    for p in range(self.world):
        C.memmove(recv + p * n, send + self.rank * n, n)


plugin, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = oracle.batches(2 * steps)
for k, run in enumerate(sys.argv[4:]):
    variant, ini = run.split(":", 1)
    m, opt = ptt.wrap(oracle.make_model("gpt2"), config=ini, lr=1e-3, plugin=plugin)
    ad = m._protrain
    if variant == "lonely":
        ad.hostcoll.all_to_all = types.MethodType(lonely, ad.hostcoll)
    losses = []
    for s in range(steps):
        x = data[2 * s + ad.rank]
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    sd = ptt.state_dict(m)   # every rank: in mode C reading a parameter gathers its parts
    if ad.rank == 0:
        torch.save(sd, os.path.join(out, "weights%d.pt" % k))
    with open(os.path.join(out, "rank%d_%d.json" % (ad.rank, k)), "w") as f:
        json.dump({"losses": losses, "world": ad.world, "mode": ptt.stats(m).mode,
                   "table": ad.hostcoll is not None}, f)
    ptt.finalize(m)
