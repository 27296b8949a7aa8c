"""The optimizer facade (lr from the param group, so lr_scheduler works;
zero_grad a no-op; state_dict / load_state_dict through save_state /
load_state), protrain.torch.state_dict(model) feeding save_pretrained, an
evaluation forward under no_grad, and the example script."""
import copy
import os
import subprocess
import sys

import torch

import oracle
import protrain.torch as ptt
from conftest import ROOT
from test_oracle import RESIDENT, STREAMED


def _sched(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def test_lr_scheduler_and_zero_grad(ini, plugin_path):
    m = oracle.make_model("gpt2")
    ref = copy.deepcopy(m)
    data = oracle.batches(6)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)
    rs = _sched(ropt)
    want = []
    for x in data:
        loss = ref(input_ids=x, labels=x).loss
        loss.backward()
        ropt.step()
        ropt.zero_grad()
        rs.step()
        want.append(loss.item())
    m, opt = ptt.wrap(m, config=ini(STREAMED), lr=1e-3, plugin=plugin_path)
    s = _sched(opt)
    got = []
    for x in data:
        opt.zero_grad()
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        s.step()
        got.append(loss.item())
    assert opt.param_groups[0]["lr"] == ropt.param_groups[0]["lr"] != 1e-3
    oracle_check = __import__("test_oracle").check
    oracle_check(got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()))
    # the streamed plan ran, so the scheduled lr reached the CPU optimizer too
    __import__("test_oracle").assert_plan(m, "streamed", steps=len(data))


def _train(m, opt, data):
    """Each step's loss, one micro-batch a step."""
    return oracle.train_losses(m, data, 1, opt.step)


def test_state_dict_round_trip(ini, plugin_path, tmp_path):
    data = oracle.batches(6)
    path = ini(STREAMED)
    m, opt = ptt.wrap(oracle.make_model("llama"), config=path, lr=1e-3, plugin=plugin_path,
                      state_dir=str(tmp_path / "state"))
    _train(m, opt, data[:3])
    sd = opt.state_dict()
    torch.save(sd, tmp_path / "opt.pt")
    cont = _train(m, opt, data[3:])
    # a fresh model (other initial weights) restored from the saved state
    m2, opt2 = ptt.wrap(oracle.make_model("llama", seed=5), config=path, lr=1e-3,
                        plugin=plugin_path)
    opt2.load_state_dict(torch.load(tmp_path / "opt.pt"))
    again = _train(m2, opt2, data[3:])
    assert again == cont
    assert oracle.rel_norm(ptt.state_dict(m2), ptt.state_dict(m)) == 0.0


def test_save_pretrained_and_eval_forward(ini, plugin_path, tmp_path):
    from transformers import LlamaForCausalLM
    data = oracle.batches(4)
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(RESIDENT), lr=1e-3,
                      plugin=plugin_path)
    _train(m, opt, data[:3])
    m.save_pretrained(tmp_path / "out", state_dict=ptt.state_dict(m))
    plain = LlamaForCausalLM.from_pretrained(tmp_path / "out")
    x = data[3]
    with torch.no_grad():
        a = m(input_ids=x).logits
        b = plain(input_ids=x).logits
    assert torch.equal(a, b)
    # outside every window a parameter keeps its shape over one NaN element: a
    # stray read computes NaN, never stale weights
    w = m.model.layers[0].mlp.up_proj.weight
    assert w.shape == plain.model.layers[0].mlp.up_proj.weight.shape
    assert torch.isnan(w.sum())
    _train(m, opt, data[3:])          # training goes on after an evaluation pass


def test_finetune_example(plugin_path, ini, tmp_path):
    from transformers import LlamaConfig
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
    cfg.save_pretrained(tmp_path)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    env = dict(os.environ, PROTRAIN_PLUGIN_PATH=os.path.dirname(plugin_path),
               PYTHONPATH=os.path.join(ROOT, "host_api", "python"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "host_api/python/examples/finetune.py"),
                        str(tmp_path / "config.json"), ini(RESIDENT), str(text), "12",
                        str(tmp_path / "out")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    losses = [float(l.split()[3]) for l in r.stdout.splitlines() if l.startswith("step ")]
    assert len(losses) == 12 and losses[-1] < losses[0]
    assert os.path.exists(tmp_path / "out" / "config.json")
