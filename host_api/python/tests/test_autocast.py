"""bf16 autocast (CPU) around the forward: a CKPT block's recompute runs in
the backward, outside the forward's autocast region, and must run under the
autocast state its forward had (the adapter saves it per block, as
torch.utils.checkpoint does). Every block CKPT against every block NONE,
both through the plugin: the same computation, so step-1 losses are
identical and the rest within the oracle's 1e-5."""
import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import CKPT, RESIDENT, check


def _run(ini, plugin_path, text, autocast):
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(text, name="%d.ini" % len(text)),
                      lr=1e-3, weight_decay=0.0, max_grad_norm=0.0, plugin=plugin_path)
    losses = []
    for x in oracle.batches(4):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = m(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return m, losses


@pytest.mark.parametrize("autocast", [True, False])
def test_ckpt_recompute_under_the_forwards_autocast(autocast, ini, plugin_path):
    m, got = _run(ini, plugin_path, CKPT, autocast)
    s = ptt.stats(m)
    assert s.n_checkpoint == 4 and s.recomputes >= 4 * 4
    ref, want = _run(ini, plugin_path, RESIDENT, autocast)
    check(got, want, oracle.rel_norm(ptt.state_dict(m), ptt.state_dict(ref)))
    if autocast:      # the autocast run really computed in bf16
        _, fp32 = _run(ini, plugin_path, RESIDENT, False)
        assert got[0] != fp32[0]
