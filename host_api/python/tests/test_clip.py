"""torch.nn.utils.clip_grad_norm_ on a wrapped model's parameters: the norm it
returns is the global norm plain PyTorch returns, and the plugin clips at that
max norm, so the weights follow plain PyTorch clipped the same way (resident
and offloaded chunks; the first step defers the CPU steps, later ones
announce). The norm only (max_norm=inf) under a frozen base (LoRA). The
refusals, and the control: torch's own function on the wrapped parameters
(the partial clip: only the non-block gradients are bound) fails the oracle."""
import copy
import math

import pytest
import torch

import oracle
import protrain.torch as ptt
from test_more import _lora
from test_oracle import RESIDENT, STREAMED, check

# these small models' gradient norm is about 0.8 after the first steps, so 0.5 clips
MAX = 0.5
STEPS = 6


def _run(model, data, step, max_norm, grad_accum=1):
    """(losses, norms): each step's mean loss and clip_grad_norm_'s return
    value, grad_accum micro-batches a step."""
    losses, norms = [], []
    params = list(model.parameters())
    for s in range(0, len(data), grad_accum):
        tot = 0.0
        for x in data[s:s + grad_accum]:
            loss = model(input_ids=x, labels=x).loss
            (loss / grad_accum).backward()
            tot += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm)))
        step()
        losses.append(tot / grad_accum)
    return losses, norms


def _pair(kind, ini, plugin_path, max_norm=MAX, setup=None, make=None, wrap_max=0.0,
          grad_accum=1):
    m = make() if make else oracle.make_model(kind)
    ref = copy.deepcopy(m)
    data = oracle.batches(STEPS * grad_accum)
    ropt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-3,
                             weight_decay=0.0)

    def rstep():
        ropt.step()
        ropt.zero_grad()
    want, want_n = _run(ref, data, rstep, max_norm, grad_accum)
    m, opt = ptt.wrap(m, config=ini, lr=1e-3, max_grad_norm=wrap_max, plugin=plugin_path,
                      grad_accum=grad_accum)
    if setup:
        setup(m)
    got, got_n = _run(m, data, opt.step, max_norm, grad_accum)
    return got, want, got_n, want_n, oracle.rel_norm(ptt.state_dict(m), ref.state_dict())


def _check_norms(got_n, want_n):
    for s, (a, b) in enumerate(zip(got_n, want_n)):
        assert abs(a - b) <= 1e-5 * b, "step %d: norm %r, plain %r" % (s + 1, a, b)


@pytest.mark.parametrize("case", ["resident", "streamed", "streamed_accum2"])
def test_clip_matches_plain(case, ini, plugin_path):
    path = ini(RESIDENT if case == "resident" else STREAMED)
    got, want, got_n, want_n, err = _pair("llama", path, plugin_path,
                                          grad_accum=2 if case.endswith("2") else 1)
    assert max(want_n) > MAX                       # the clipping is active
    _check_norms(got_n, want_n)
    check(got, want, err)


def test_control_partial_clip_fails(ini, plugin_path):
    """torch's own clip_grad_norm_ on the wrapped parameters sees only the
    gradients bound outside the block windows (the non-block ones)."""
    def setup(m):
        m._protrain.clip_passthrough = True
    got, want, got_n, want_n, err = _pair("llama", ini(STREAMED), plugin_path, setup=setup)
    with pytest.raises(AssertionError):
        _check_norms(got_n, want_n)
    with pytest.raises(AssertionError):
        check(got, want, err)


def test_norm_only_under_lora(ini, plugin_path):
    """max_norm=inf: the norm, no clipping; a frozen base counts nothing."""
    def make():
        torch.manual_seed(3)
        m = _lora(oracle.make_model("llama"))
        for name, p in m.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        return m
    got, want, got_n, want_n, err = _pair("llama", ini(STREAMED), plugin_path,
                                          max_norm=math.inf, make=make)
    assert min(want_n) > 0
    _check_norms(got_n, want_n)
    check(got, want, err)


def test_same_max_as_wrap_clips_once(ini, plugin_path):
    got, want, got_n, want_n, err = _pair("gpt2", ini(STREAMED), plugin_path, wrap_max=MAX)
    _check_norms(got_n, want_n)
    check(got, want, err)


def test_refusals_and_pass_through(ini, plugin_path):
    m, opt = ptt.wrap(oracle.make_model("gpt2"), config=ini(STREAMED), lr=1e-3,
                      max_grad_norm=1.0, plugin=plugin_path)
    x = oracle.batches(1)[0]
    params = list(m.parameters())
    m(input_ids=x, labels=x).loss.backward()
    with pytest.raises(ValueError, match="norm_type=1; the plugin computes the global L2"):
        torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type=1)
    with pytest.raises(ValueError, match="max_grad_norm=1, which already clips every step"):
        torch.nn.utils.clip_grad_norm_(params, 2.0)
    with pytest.raises(ValueError, match="max_norm=0 would zero every gradient"):
        torch.nn.utils.clip_grad_norm_(params, 0.0)
    with pytest.raises(ValueError, match="got 1 of the model's"):
        torch.nn.utils.clip_grad_norm_(params[:1], 1.0)
    plain = torch.nn.Linear(4, 4)                  # not wrapped: torch's own function
    plain(torch.ones(2, 4)).sum().backward()
    n = torch.nn.utils.clip_grad_norm_(plain.parameters(), 1e-3)
    assert float(n) > 1e-3 and abs(float(torch.cat([p.grad.flatten() for p in
                                                    plain.parameters()]).norm()) - 1e-3) < 1e-6
    opt.step()


def test_late_clip_refused(ini, plugin_path):
    """Steps that did not clip let the CPU step during backward: a later clip
    is refused with a sentence (the step stays valid, unclipped)."""
    m, opt = ptt.wrap(oracle.make_model("gpt2"), config=ini(STREAMED), lr=1e-3,
                      plugin=plugin_path)
    data = oracle.batches(3)
    for x in data[:2]:
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
    m(input_ids=data[2], labels=data[2]).loss.backward()
    with pytest.raises(RuntimeError, match="clip in every step from the first, or in none"):
        torch.nn.utils.clip_grad_norm_(m.parameters(), MAX)
    opt.step()


def test_resume_with_clipping(ini, plugin_path):
    """A resumed run (its step count from the state) learns the clipping again
    from its own first step: no refusal, bit-identical to the uninterrupted run."""
    data = oracle.batches(4)
    path = ini(STREAMED)

    def run(m, opt, xs):
        return _run(m, xs, opt.step, MAX)

    m, opt = ptt.wrap(oracle.make_model("llama"), config=path, lr=1e-3, plugin=plugin_path)
    whole = run(m, opt, data)
    m, opt = ptt.wrap(oracle.make_model("llama"), config=path, lr=1e-3, plugin=plugin_path)
    first = run(m, opt, data[:2])
    sd, osd = ptt.state_dict(m), opt.state_dict()
    m2, opt2 = ptt.wrap(oracle.make_model("llama", seed=3), config=path, lr=1e-3,
                        plugin=plugin_path)
    m2.load_state_dict(sd)
    opt2.load_state_dict(osd)
    rest = run(m2, opt2, data[2:])
    assert first[0] + rest[0] == whole[0] and first[1] + rest[1] == whole[1]
