"""A failed step recovers (the adapter's _recover.py, the plugin's discard_step).

Each kind of failure happens in step 2 of a 4-step run on a seeded Hugging
Face Llama: an exception inside block 2's forward (a pre-hook that raises), a
token id >= vocab (the embedding raises), an exception from block 2's
backward hook, a loss dropped without backward, an evaluation forward that
raises, and with grad_accum = 2 a failure in micro-batch 1. The run catches
the exception (where there is one), gets a RuntimeWarning naming what
happened, and trains on. Oracle: the same run without the failed batches
(with accumulation: without the dropped step's two micro-batches), through
the plugin, bit-identical in every loss and weight; and (resident) plain
PyTorch on the batches that trained, within test_oracle's bounds. Every kind
under a resident plan; a failed backward under a checkpointed plan (a
recompute inside it) and accumulation under a streamed one. Negative
control: with the adapter's skip_discard switch (the failure left as it was)
the next pass is refused and the run does not finish.
Where a step cannot be dropped (the CPU optimizer already stepped chunks of
it during its backward) the next forward says so. model.half(),
.bfloat16(), .to(float16), .double() after wrap are refused without changing
anything; control: without the guard the next loss is not the reference's.
"""
import copy
import warnings

import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import CKPT, RESIDENT, STREAMED, check

CONFIGS = {"resident": RESIDENT, "ckpt": CKPT, "streamed": STREAMED}
KINDS = ("forward", "token", "backward", "dropped_loss", "eval", "micro1")


class Boom(Exception):
    pass


def _data(n):
    return oracle.batches(n, seed=21)


def _run(model, opt, data, fail=None, grad_accum=1, plain=False):
    """Trains on data (grad_accum micro-batches a step) with the failure
    `fail` in the first micro-batch of step 2 (micro-batch 1 for "micro1");
    returns the losses of the steps that trained."""
    blk = model.model.layers[2]
    armed = {"on": False}

    def fwd_hook(m, a):
        if armed["on"]:
            raise Boom("bad batch in block 2's forward")

    def bwd_hook(m, gi, go):
        if armed["on"]:
            raise Boom("bad gradient in block 2's backward")
    handles = [blk.register_forward_pre_hook(fwd_hook), blk.register_full_backward_hook(bwd_hook)]
    losses = []
    it = iter(data)
    step = 0
    while True:
        step += 1
        tot, n = 0.0, 0
        try:
            for micro in range(grad_accum):
                x = next(it)
                at = fail is not None and step == 2 and micro == (1 if fail == "micro1" else 0)
                if at and fail == "eval":
                    with torch.no_grad(), pytest.raises(IndexError):
                        model(input_ids=x.clamp(max=0) + oracle.VOCAB, labels=x)
                if at and fail in ("forward", "micro1"):
                    armed["on"] = True
                    with pytest.raises(Boom):
                        model(input_ids=x, labels=x)
                    armed["on"] = False
                    raise _Skip()
                if at and fail == "token":
                    bad = x.clone()
                    bad[0, 5] = oracle.VOCAB + 3
                    with pytest.raises(IndexError):
                        model(input_ids=bad, labels=bad)
                    raise _Skip()
                loss = model(input_ids=x, labels=x).loss
                if at and fail == "dropped_loss":
                    raise _Skip()
                if at and fail == "backward":
                    armed["on"] = True
                    with pytest.raises(Boom):
                        (loss / grad_accum).backward()
                    armed["on"] = False
                    raise _Skip()
                (loss / grad_accum).backward()
                tot += loss.item()
                n += 1
            opt.step()
            if plain:
                opt.zero_grad()
            losses.append(tot / n)
        except _Skip:
            if plain:
                opt.zero_grad()
            # the rest of this step's micro-batches are skipped with it
            for _ in range(grad_accum - 1 - micro):
                next(it)
        except StopIteration:
            break
    for h in handles:
        h.remove()
    return losses


class _Skip(Exception):
    pass


def _wrapped(ini, plugin, grad_accum, setup=None):
    m = oracle.make_model("llama")
    ref = copy.deepcopy(m)
    m, opt = ptt.wrap(m, config=ini, lr=1e-3, weight_decay=0.0, max_grad_norm=0.0,
                      grad_accum=grad_accum, plugin=plugin)
    if setup:
        setup(m._protrain)
    return m, opt, ref


def _state(m):
    return {k: v.clone() for k, v in ptt.state_dict(m).items()}


# every kind under a resident plan; under checkpointed and streamed plans the
# kinds that reach their own paths (a recompute in the failed backward; leased
# buffers and CPU-side gradients of offloaded chunks). A failed backward under
# the streamed plan is refused by design (test_backward_after_cpu_steps_is_refused).
CASES = [(k, "resident") for k in KINDS] + [("backward", "ckpt"), ("micro1", "streamed")]


@pytest.mark.parametrize("kind,config", CASES)
def test_failed_step_is_dropped(kind, config, ini, plugin_path):
    ga = 2 if kind == "micro1" else 1
    data = _data(4 * ga)
    # the failed attempt takes the first micro-batch(es) of step 2 off the data
    dropped = {1 * ga, 1 * ga + 1} if ga == 2 else ({1} if kind != "eval" else set())
    clean = [x for i, x in enumerate(data) if i not in dropped]
    m, opt, ref = _wrapped(ini(CONFIGS[config]), plugin_path, ga)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = _run(m, opt, data, fail=kind, grad_accum=ga)
    msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    if kind == "eval":
        assert any("the evaluation forward raised IndexError" in s and "closed" in s
                   for s in msgs), msgs
    else:
        assert any("step 2 was dropped (%d micro-batch(es)" % (2 if ga == 2 else 1) in s
                   for s in msgs), msgs
    # a run that never saw the dropped batches, through the plugin: bit-identical
    m2, opt2, _ = _wrapped(ini(CONFIGS[config]), plugin_path, ga)
    want_plugin = _run(m2, opt2, clean, grad_accum=ga)
    assert got == want_plugin
    a, b = _state(m), _state(m2)
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert ptt.stats(m).steps == ptt.stats(m2).steps == len(clean) // ga
    assert m._protrain.step == m2._protrain.step == len(clean) // ga   # the step number went back
    # and plain PyTorch on the same batches (once per kind: resident)
    if config == "resident":
        ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)
        want = _run(ref, ropt, clean, grad_accum=ga, plain=True)
        check(got, want, oracle.rel_norm(a, ref.state_dict()))


@pytest.mark.parametrize("kind", ("forward", "backward", "dropped_loss"))
def test_without_discard_the_run_stops(kind, ini, plugin_path):
    """Negative control: the failure left in place (skip_discard), the next
    pass is refused and the run does not finish."""
    def setup(ad):
        ad.skip_discard = True
    m, opt, _ = _wrapped(ini(RESIDENT), plugin_path, 1, setup)
    with pytest.raises(Exception) as e:
        _run(m, opt, _data(5), fail=kind)
    assert not isinstance(e.value, Boom)


def test_backward_after_cpu_steps_is_refused(ini, plugin_path):
    """Streamed chunks stepped by the CPU optimizer during the failed backward
    (overlap) cannot be dropped: the next forward says so with the plugin's
    sentence."""
    m, opt, _ = _wrapped(ini(STREAMED), plugin_path, 1)
    x = _data(2)
    m(input_ids=x[0], labels=x[0]).loss.backward()
    opt.step()

    def boom(mod, gi, go):
        raise Boom("bad gradient in block 0's backward")
    h = m.model.layers[0].register_full_backward_hook(boom)
    with pytest.raises(Boom):
        m(input_ids=x[1], labels=x[1]).loss.backward()
    h.remove()
    with pytest.raises(RuntimeError, match="the step cannot be dropped: discard_step: the CPU "
                                           "optimizer already stepped [0-9]+ offloaded chunk"):
        m(input_ids=x[1], labels=x[1])


CASTS = {
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "to_float16": lambda m: m.to(torch.float16),
    "double": lambda m: m.double(),
    "one_block_half": lambda m: m.model.layers[1].half(),
}


def test_dtype_change_after_wrap_is_refused(ini, plugin_path):
    """Each conversion after wrap is refused and changes nothing: training goes
    on bit-identical to a run without the calls. model.float() and
    model.to("cpu") change no dtype and pass."""
    data = _data(3)
    runs = []
    for attempt in (True, False):
        m, opt, _ = _wrapped(ini(RESIDENT), plugin_path, 1)
        losses = []
        for i, x in enumerate(data):
            if i == 1 and attempt:
                for name, cast in sorted(CASTS.items()):
                    with pytest.raises(RuntimeError, match="refused and nothing changed"):
                        cast(m)
                m.float()
                m.to("cpu")
            loss = m(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append((losses, _state(m)))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], v) for k, v in runs[1][1].items())


def test_dtype_change_without_the_guard_breaks_training(ini, plugin_path):
    """Negative control: with the guard taken off, model.half() goes through and
    the next step's loss is not the reference's (the plugin's fp32 bytes are
    read as fp16)."""
    data = _data(2)
    m, opt, _ = _wrapped(ini(RESIDENT), plugin_path, 1)
    m2, opt2, _ = _wrapped(ini(RESIDENT), plugin_path, 1)
    for mod, o in ((m, opt), (m2, opt2)):
        mod(input_ids=data[0], labels=data[0]).loss.backward()
        o.step()
    for mod in m.modules():
        mod.__dict__.pop("_apply", None)
    m._protrain._check_dtypes = lambda: None
    m.half()
    want = m2(input_ids=data[1], labels=data[1]).loss.item()
    try:
        got = m(input_ids=data[1], labels=data[1]).loss.float().item()
    except Exception:
        return          # failing outright also shows the guard is needed
    assert got != want


def test_step_after_a_dropped_step_is_skipped(ini, plugin_path):
    """optimizer.step() right after its step was dropped has nothing to step:
    skipped with a warning (as a GradScaler skips an overflowed step), and the
    run goes on as one without the failed batch."""
    data = _data(3)
    m, opt, _ = _wrapped(ini(RESIDENT), plugin_path, 1)
    m2, opt2, _ = _wrapped(ini(RESIDENT), plugin_path, 1)
    for mod, o in ((m, opt), (m2, opt2)):
        mod(input_ids=data[0], labels=data[0]).loss.backward()
        o.step()
    bad = data[1].clone()
    bad[1, 3] = oracle.VOCAB
    with pytest.warns(RuntimeWarning, match="step 2 was dropped"):
        with pytest.raises(IndexError):
            m(input_ids=bad, labels=bad)
    with pytest.warns(RuntimeWarning, match="optimizer.step\\(\\) after its step was dropped: "
                                            "nothing to step, skipped"):
        opt.step()
    for mod, o in ((m, opt), (m2, opt2)):
        mod(input_ids=data[2], labels=data[2]).loss.backward()
        o.step()
    assert ptt.stats(m).steps == ptt.stats(m2).steps == 2
    a, b = _state(m), _state(m2)
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_first_forward_that_raises_is_retried(ini, plugin_path):
    """A bad first batch raises inside the profile (post_model_load fails); the
    next forward loads and profiles again from the weights the model had, and
    the run equals one that started with the good batch."""
    prof = "[memory]\ndevice_capacity = 64MiB\n"
    data = _data(2)
    m, opt, _ = _wrapped(ini(prof), plugin_path, 1)
    bad = data[0].clone()
    bad[0, 0] = oracle.VOCAB + 1
    with pytest.raises(IndexError):
        m(input_ids=bad, labels=bad)
    m2, opt2, _ = _wrapped(ini(prof), plugin_path, 1)
    for mod, o in ((m, opt), (m2, opt2)):
        for x in data:
            mod(input_ids=x, labels=x).loss.backward()
            o.step()
    a, b = _state(m), _state(m2)
    assert all(torch.equal(a[k], b[k]) for k in b)
