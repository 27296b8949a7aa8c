"""Every public way to read a wrapped model gives the trained weights
(model.state_dict in its forms, torch.save of it, save_pretrained with and
without state_dict=, num_parameters); parameters outside a step keep their
shape and read NaN; the optimizer's state_dict carries the plugin's state as
bytes, so a moved checkpoint resumes bit-exactly and nothing is left on disk.
The control: with the state-dict hooks off the saves hold the placeholders
and the comparison fails."""
import copy
import glob
import os
import shutil
import tempfile

import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import STREAMED, check


def _train(m, opt, data):
    """Each step's loss, one micro-batch a step."""
    return oracle.train_losses(m, data, 1, opt.step)


def _equal(a, b):
    """The keys of b all in a, every tensor bit-identical."""
    return all(k in a and a[k].shape == v.shape and torch.equal(a[k], v) for k, v in b.items())


def _saves_hold(m, want, tmp_path):
    """torch.save(model.state_dict()) reloaded into a fresh plain model, and
    save_pretrained without state_dict=, both give `want`."""
    from transformers import LlamaForCausalLM
    torch.save(m.state_dict(), tmp_path / "sd.pt")
    plain = oracle.make_model("llama", seed=9)
    try:
        plain.load_state_dict(torch.load(tmp_path / "sd.pt"))
    except RuntimeError:            # the control's 0-sized or NaN tensors
        return False
    if not _equal(plain.state_dict(), want):
        return False
    m.save_pretrained(tmp_path / "hf")
    back = LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    return _equal(back.state_dict(), want)


def _left(d):
    return glob.glob(os.path.join(str(d), "protrain_state_*"))


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """tempfile's folder pointed at a private one, to see what a save leaves."""
    d = tmp_path / "scratch"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def test_saves_hold_the_trained_weights(ini, plugin_path, tmp_path, scratch):
    from transformers import LlamaForCausalLM
    m0 = oracle.make_model("llama")
    n_plain = m0.num_parameters()
    m, opt = ptt.wrap(m0, config=ini(STREAMED), lr=1e-3, plugin=plugin_path)
    _train(m, opt, oracle.batches(3))
    want = ptt.state_dict(m)
    init = oracle.make_model("llama").state_dict()
    assert not _equal(want, init)                        # training moved the weights
    sd = m.state_dict()
    assert _equal(sd, want) and set(sd) == set(want)
    assert _equal({k: v.detach() for k, v in m.state_dict(keep_vars=True).items()}, want)
    sub = m.model.layers[1].state_dict(prefix="x.")
    assert sub and all(torch.equal(v, want["model.layers.1." + k[2:]]) for k, v in sub.items())
    assert m.num_parameters() == n_plain
    assert _saves_hold(m, want, tmp_path)
    m.save_pretrained(tmp_path / "hf2", state_dict=m.state_dict())
    assert _equal(LlamaForCausalLM.from_pretrained(tmp_path / "hf2").state_dict(), want)
    # a parameter outside a step: its shape, NaN values, writes refused
    w = m.model.layers[0].mlp.up_proj.weight
    assert w.shape == want["model.layers.0.mlp.up_proj.weight"].shape
    assert torch.isnan(w.detach().sum())
    with pytest.raises(RuntimeError):
        with torch.no_grad():
            w.add_(1.0)
    assert _left(scratch) == []


def test_control_placeholder_save_fails(ini, plugin_path, tmp_path):
    """The state-dict hooks off: the saves write the placeholders (NaN), so the
    same comparison fails."""
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(STREAMED), lr=1e-3,
                      plugin=plugin_path)
    _train(m, opt, oracle.batches(2))
    want = ptt.state_dict(m)
    m._protrain.raw_state_dict = True
    assert not _saves_hold(m, want, tmp_path)


def test_moved_checkpoint_resumes_bit_exactly(ini, plugin_path, tmp_path, scratch):
    data = oracle.batches(6)
    path = ini(STREAMED)
    m, opt = ptt.wrap(oracle.make_model("llama"), config=path, lr=1e-3, plugin=plugin_path)
    whole = _train(m, opt, data)
    want = ptt.state_dict(m)

    m, opt = ptt.wrap(oracle.make_model("llama"), config=path, lr=1e-3, plugin=plugin_path)
    first = _train(m, opt, data[:3])
    ck = tmp_path / "run" / "ckpt"
    ck.mkdir(parents=True)
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, ck / "all.pt")
    moved = tmp_path / "elsewhere"
    shutil.move(str(tmp_path / "run"), str(moved))
    assert _left(scratch) == []                 # the save left nothing behind

    ck = torch.load(moved / "ckpt" / "all.pt")
    assert all(isinstance(t, torch.Tensor) for t in ck["opt"]["protrain"]["files"].values())
    m2, opt2 = ptt.wrap(oracle.make_model("llama", seed=5), config=path, lr=1e-3,
                        plugin=plugin_path)
    m2.load_state_dict(ck["model"])                  # before the first forward
    opt2.load_state_dict(ck["opt"])
    rest = _train(m2, opt2, data[3:])
    assert first + rest == whole
    assert oracle.rel_norm(ptt.state_dict(m2), want) == 0.0
    assert _left(scratch) == []


def test_optimizer_round_trip_before_the_first_forward(ini, plugin_path, scratch):
    """accelerate's prepare round-trips state_dict/load_state_dict before any
    forward: nothing changes, nothing is left on disk."""
    data = oracle.batches(3)
    path = ini(STREAMED)
    m, opt = ptt.wrap(oracle.make_model("gpt2"), config=path, lr=1e-3, plugin=plugin_path)
    want = _train(m, opt, data)
    m, opt = ptt.wrap(oracle.make_model("gpt2"), config=path, lr=1e-3, plugin=plugin_path)
    sd = opt.state_dict()
    assert sd["protrain"]["files"] is None
    opt.load_state_dict(sd)
    assert _train(m, opt, data) == want
    sd2 = m.state_dict()               # GPT-2's tied head: one copy under both names
    assert sd2["lm_head.weight"].data_ptr() == sd2["transformer.wte.weight"].data_ptr()
    assert _left(scratch) == []
    # that dict holds no plugin state: loading it after training is refused
    with pytest.raises(ValueError, match="saved before the first forward"):
        opt.load_state_dict(sd)


def test_load_after_the_first_forward(ini, plugin_path):
    """load_state_dict into a model that has trained writes the plugin's
    weights (read back exactly) and keeps the optimizer's moments, as torch's
    load into a plain model keeps its AdamW state: the run continues like
    plain PyTorch doing the same load."""
    data = oracle.batches(4)
    other = oracle.make_model("llama", seed=7).state_dict()
    m = oracle.make_model("llama")
    ref = copy.deepcopy(m)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)

    def rstep():
        ropt.step()
        ropt.zero_grad()
    want = oracle.train_losses(ref, data[:2], 1, rstep)
    ref.load_state_dict(other)
    want += oracle.train_losses(ref, data[2:], 1, rstep)
    m, opt = ptt.wrap(m, config=ini(STREAMED), lr=1e-3, plugin=plugin_path)
    got = _train(m, opt, data[:2])
    m.load_state_dict(other)
    assert _equal(ptt.state_dict(m), other)
    got += _train(m, opt, data[2:])
    check(got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()))


def test_load_into_bf16_masters(ini, plugin_path):
    """A bf16 model: the load reaches the fp32 masters too (a step at lr 0
    writes the masters back into the weights, which keep the loaded values)."""
    data = oracle.batches(2)
    m, opt = ptt.wrap(oracle.make_model("llama", dtype=torch.bfloat16), config=ini(STREAMED),
                      lr=1e-3, plugin=plugin_path)
    _train(m, opt, data[:1])
    other = oracle.make_model("llama", seed=7, dtype=torch.bfloat16).state_dict()
    m.load_state_dict(other)
    opt.param_groups[0]["lr"] = 0.0
    _train(m, opt, data[1:])
    assert _equal(ptt.state_dict(m), other)


def test_load_refusals(ini, plugin_path):
    m, opt = ptt.wrap(oracle.make_model("gpt2"), config=ini(), lr=1e-3, plugin=plugin_path)
    data = oracle.batches(2)
    _train(m, opt, data[:1])
    sd = ptt.state_dict(m)
    with pytest.raises(RuntimeError, match="assign=True"):
        m.load_state_dict(sd, assign=True)
    m(input_ids=data[1], labels=data[1]).loss.backward()
    with pytest.raises(RuntimeError, match="inside a training step"):
        m.load_state_dict(sd)
    opt.step()
