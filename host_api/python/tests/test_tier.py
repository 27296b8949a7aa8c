"""The disk tier ([nvme] path) under the PyTorch host: a small Llama streamed
with every block chunk offloaded trains through the tier's level 1 (Adam
states on disk) and level 2 (whole chunk images on disk) with clipping
(torch.nn.utils.clip_grad_norm_) as plain PyTorch does, and the weights a save
reads back (read_param through the tier's views) are plain PyTorch's. The tier's
file is gone after the wrap is finalized. The control: the tier's reads
skipped ([testing] debug_skip_ordering = 16384) break the oracle."""
import copy
import os

import pytest
import torch

import oracle
import protrain.torch as ptt
from test_clip import MAX, STEPS, _check_norms, _pair, _run
from test_oracle import STREAMED, check


def _tier_ini(ini, tmp_path, level, extra=""):
    d = tmp_path / "tier"
    d.mkdir(exist_ok=True)
    return ini(STREAMED + "[nvme]\npath = %s\nblock_size = 512\n[testing]\n"
               "debug_tier_force = true\ndebug_tier_level = %d\n%s" % (d, level, extra)), d


@pytest.mark.parametrize("level", [1, 2])
def test_tier_matches_plain(level, ini, plugin_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PROTRAIN_TESTING", "1")
    path, d = _tier_ini(ini, tmp_path, level)
    m = oracle.make_model("llama")
    ref = copy.deepcopy(m)
    data = oracle.batches(STEPS)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)

    def rstep():
        ropt.step()
        ropt.zero_grad()
    want, want_n = _run(ref, data, rstep, MAX)
    m, opt = ptt.wrap(m, config=path, lr=1e-3, plugin=plugin_path)
    got, got_n = _run(m, data, opt.step, MAX)
    assert max(want_n) > MAX                       # the clipping is active
    _check_norms(got_n, want_n)
    # the saved weights (read_param, through the tier's views) vs plain
    check(got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()))
    assert "protrain-tier.rank0.bin" in os.listdir(d)
    ptt.finalize(m)                                # the tier's files go with the plugin
    assert not [f for f in os.listdir(d) if f.startswith("protrain-tier")]


def test_control_reads_skipped(ini, plugin_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PROTRAIN_TESTING", "1")
    path, _ = _tier_ini(ini, tmp_path, 2, "debug_skip_ordering = 16384\n")
    got, want, _, _, err = _pair("llama", path, plugin_path)
    with pytest.raises(AssertionError):
        check(got, want, err)
