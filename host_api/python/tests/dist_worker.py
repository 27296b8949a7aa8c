"""One rank of the 2-rank run (started by mpirun from test_dist.py): rank r
trains on micro-batch 2s+r of step s; writes its losses and final weights."""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import oracle  # noqa: E402
import protrain.torch as ptt  # noqa: E402

ini, plugin, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
m, opt = ptt.wrap(oracle.make_model("gpt2"), config=ini, lr=1e-3, plugin=plugin)
ad = m._protrain
data = oracle.batches(2 * steps)
losses = []
for s in range(steps):
    x = data[2 * s + ad.rank]
    loss = m(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    losses.append(loss.item())
sd = ptt.state_dict(m)
if ad.rank == 0:
    torch.save(sd, os.path.join(out, "weights.pt"))
with open(os.path.join(out, "rank%d.json" % ad.rank), "w") as f:
    json.dump({"losses": losses, "world": ad.world}, f)
ptt.finalize(m)
