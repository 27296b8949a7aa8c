"""protrain.torch.unwrap gives the model back: its own forward, no hook of the
wrap left, the trained weights as ordinary parameters (a plain optimizer step
on it equals one on a fresh model loaded with those weights), and it can be
wrapped again. The control: unwrapping without rebinding the parameters
leaves the NaN placeholders, and the weight check fails."""
import inspect

import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import STREAMED

HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
         "_state_dict_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def _hooks(m):
    return [sum(len(getattr(mod, h)) for h in HOOKS) for mod in m.modules()] + \
        [len(p._post_accumulate_grad_hooks or {}) for p in m.parameters()]


def _train(m, opt, data):
    for x in data:
        m(input_ids=x, labels=x).loss.backward()
        opt.step()


def _plain_step(m, x):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _unwrapped(m, want):
    sd = m.state_dict()
    return all(torch.equal(sd[k], v) for k, v in want.items())


def test_unwrap(ini, plugin_path):
    m = oracle.make_model("llama")
    before = _hooks(m)
    m, opt = ptt.wrap(m, config=ini(STREAMED), lr=1e-3, plugin=plugin_path)
    # the wrapped forward shows the model's parameters (the HF Trainer picks
    # the dataset's columns by them; (*args, **kwargs) would drop them all)
    assert {"input_ids", "labels"} <= set(inspect.signature(m.forward).parameters)
    data = oracle.batches(4)
    _train(m, opt, data[:2])
    want = ptt.state_dict(m)
    assert ptt.unwrap(m) is m
    assert not hasattr(m, "_protrain") and "forward" not in m.__dict__
    assert _hooks(m) == before
    assert _unwrapped(m, want)
    fresh = oracle.make_model("llama", seed=4)
    fresh.load_state_dict(want)
    a, b = _plain_step(m, data[2]), _plain_step(fresh, data[2])
    assert all(torch.equal(a[k], b[k]) for k in b)
    m, opt = ptt.wrap(m, config=ini(STREAMED), lr=1e-3, plugin=plugin_path)
    _train(m, opt, data[3:])


def test_control_unwrap_without_rebind(ini, plugin_path):
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(STREAMED), lr=1e-3,
                      plugin=plugin_path)
    _train(m, opt, oracle.batches(1))
    want = ptt.state_dict(m)
    m._protrain.unwrap_skip_rebind = True
    ptt.unwrap(m)
    assert not _unwrapped(m, want)
    with pytest.raises(AssertionError):
        assert _unwrapped(m, want)
