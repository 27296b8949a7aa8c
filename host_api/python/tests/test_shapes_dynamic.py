"""Any batch shape trains (the adapter's _shapes.py, the plugin's replan).

Against plain PyTorch on the same seeded Hugging Face Llama and the same
batches (losses and weights within test_oracle's bounds, step-1 loss
bit-identical): dynamic padding (each batch padded to its own longest sample,
attention_mask and -100 labels, the first batch shorter than later ones), a
short last batch, a packed stream with a short tail, and evaluation batches
of any size between the steps, each under a resident plan, dynamic padding
also under plans that checkpoint and stream. A larger batch is profiled and planned for
(the predicted peak grows), and one the device cannot hold is refused naming
bytes while the plan in force keeps training. Negative control: with the
plan's shape frozen (the adapter's test switch frozen_shape, the behaviour
before replan) each data set is refused at its first batch of another shape.
"""
import copy

import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import CKPT, RESIDENT, STREAMED, SWAP, check

CONFIGS = {"resident": RESIDENT, "ckpt": CKPT, "swap": SWAP, "streamed": STREAMED}


def _padded(lengths, seed):
    """One batch per list of sample lengths, right-padded to its longest."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for lens in lengths:
        B, T = len(lens), max(lens)
        ids = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.long)
        labels = torch.full((B, T), -100, dtype=torch.long)
        for i, n in enumerate(lens):
            x = torch.randint(1, oracle.VOCAB, (n,), generator=g)
            ids[i, :n], mask[i, :n], labels[i, :n] = x, 1, x
        out.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
    return out


def _packed(n_tokens, rows, seq, seed):
    """A token stream cut into rows of seq tokens, batches of `rows` rows; the
    stream's tail is its own shorter batch of one row."""
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, oracle.VOCAB, (n_tokens,), generator=g)
    full = n_tokens // (rows * seq)
    out = [stream[i * rows * seq:(i + 1) * rows * seq].view(rows, seq) for i in range(full)]
    tail = stream[full * rows * seq:]
    out.append(tail.view(1, -1))
    return [dict(input_ids=x, labels=x) for x in out]


def _plain(n, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return [dict(input_ids=x, labels=x)
            for x in (torch.randint(0, oracle.VOCAB, (B, T), generator=g) for _ in range(n))]


DATA = {
    # the first batch is the shortest: every longer one re-plans or fits
    "dynamic_padding": lambda: _padded([[20, 31, 9, 12], [64, 40, 3, 50], [33, 17, 8, 2],
                                        [61, 64, 59, 1], [5, 44]], seed=3),
    "short_last_batch": lambda: _plain(3, 4, 64, seed=4) + _plain(1, 2, 64, seed=5),
    "packing_tail": lambda: _packed(3 * 4 * 64 + 37, 4, 64, seed=6),
}
EVAL = [dict(input_ids=x, labels=x) for x in
        (torch.randint(0, oracle.VOCAB, s, generator=torch.Generator().manual_seed(9))
         for s in ((1, 7), (8, 64), (3, 50)))]


def _train(model, step, data, evals):
    """Loss of each step, then of each evaluation batch after it."""
    out = []
    for kw in data:
        loss = model(**kw).loss
        loss.backward()
        step()
        out.append(loss.item())
        with torch.no_grad():
            out.extend(model(**e).loss.item() for e in evals)
    return out


def _pair(ini, plugin, data, evals=(), setup=None):
    """Through the plugin first (a refusal costs no reference run), then plain
    PyTorch from the same initial weights."""
    m = oracle.make_model("llama")
    ref = copy.deepcopy(m)
    m, popt = ptt.wrap(m, config=ini, lr=1e-3, weight_decay=0.0, max_grad_norm=0.0,
                       plugin=plugin)
    if setup:
        setup(m._protrain)
    got = _train(m, popt.step, data, evals)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)

    def ref_step():
        opt.step()
        opt.zero_grad()
    want = _train(ref, ref_step, data, evals)
    return got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()), m


# every data set under a resident plan; dynamic padding (the most shapes)
# under plans that checkpoint and stream too (SWAP arenas: test_step_ctl.c)
CASES = [(d, "resident") for d in sorted(DATA)] + [("dynamic_padding", c)
                                                   for c in ("ckpt", "streamed")]


@pytest.mark.parametrize("data,config", CASES)
def test_any_shape_matches_pytorch(data, config, ini, plugin_path):
    batches = DATA[data]()
    # evaluation batches of other sizes after every step (once: under the
    # resident plan; they ask for no arena under any plan)
    evals = EVAL if (data, config) == ("dynamic_padding", "resident") else ()
    got, want, err, m = _pair(ini(CONFIGS[config]), plugin_path, batches, evals)
    check(got, want, err)
    assert ptt.stats(m).steps == len(batches)


@pytest.mark.parametrize("data", sorted(DATA))
def test_frozen_shape_is_refused(data, ini, plugin_path):
    """The negative control: the plan's shape frozen, each data set stops at
    its first batch of another shape."""
    def freeze(ad):
        ad.frozen_shape = True
    with pytest.raises(RuntimeError, match="the plan was profiled and made for .* the shape is "
                                           "frozen"):
        _pair(ini(RESIDENT), plugin_path, DATA[data](), setup=freeze)


# profiled plans: auto_memory with a device of 64 MiB
PROFILED = "[memory]\ndevice_capacity = 64MiB\n"


def test_larger_batch_replans(ini, plugin_path):
    """A batch larger in both dimensions is profiled and planned for before its
    pass (the predicted peak grows with its activations); training matches
    plain PyTorch through it, and the smaller batches after it use its plan."""
    data = _plain(1, 2, 32, seed=7) + _plain(2, 4, 64, seed=8) + _plain(1, 2, 48, seed=10)
    peaks = []

    def setup(ad):
        orig = ad._replan

        def spy(*a):
            peaks.append(ad.ctx.stats().pred_peak)
            orig(*a)
            peaks.append(ad.ctx.stats().pred_peak)
        ad._replan = spy
    got, want, err, m = _pair(ini(PROFILED), plugin_path, data, setup=setup)
    check(got, want, err)
    assert m._protrain.replans == 1 and m._protrain.shape == (4, 64)
    assert len(peaks) == 2 and peaks[1] > peaks[0], peaks


def test_batch_the_device_cannot_hold_is_refused(ini, plugin_path):
    """A batch whose activations do not fit the device is refused with the bytes
    it needed; the plan in force stays and trains, equal to PyTorch trained on
    the batches that ran."""
    small = _plain(3, 2, 32, seed=11)
    huge = _plain(1, 256, 64, seed=12)[0]
    m0 = oracle.make_model("llama")
    ref = copy.deepcopy(m0)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)
    m, opt = ptt.wrap(m0, config=ini(PROFILED), lr=1e-3, weight_decay=0.0,
                      plugin=plugin_path)
    got, want = [], []
    for i, kw in enumerate(small):
        if i == 1:
            with pytest.raises(RuntimeError, match="batch 256 x sequence 64, larger than the "
                               "batch 2 x sequence 32 the plan was made for, and planning for "
                               "batch 256 x sequence 64 failed: .*[0-9]+ bytes.*the plan for "
                               "batch 2 x sequence 32 stays"):
                m(**huge)
        for mod, o, out in ((m, opt, got), (ref, ropt, want)):
            loss = mod(**kw).loss
            loss.backward()
            o.step()
            o.zero_grad()
            out.append(loss.item())
    check(got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()))
    assert m._protrain.shape == (2, 32)


def test_plan_grows_per_dimension(ini, plugin_path):
    """A batch larger in one dimension and smaller in the other is planned for
    at the larger of both shapes per dimension: alternating shapes plan once."""
    data = (_plain(1, 4, 32, seed=13) + _plain(1, 2, 64, seed=14) + _plain(1, 4, 64, seed=15) +
            _plain(1, 3, 48, seed=16))
    got, want, err, m = _pair(ini(RESIDENT), plugin_path, data)
    check(got, want, err)
    assert m._protrain.replans == 1 and m._protrain.shape == (4, 64)


def test_declared_plan_shape(ini, plugin_path):
    """wrap(plan_shape=) plans for that shape at the first forward, profiling on
    the first batch repeated up to it (rows and positions cycled): no batch up
    to it re-plans, training matches PyTorch, and the measured peak stays
    within the plan's prediction."""
    data = DATA["dynamic_padding"]()

    def setup(ad):
        ad.plan_shape = (4, 64)
    got, want, err, m = _pair(ini(PROFILED), plugin_path, data, setup=setup)
    check(got, want, err)
    ad = m._protrain
    assert ad.replans == 0 and ad.shape == (4, 64)
    assert (ad.model_desc.batch, ad.model_desc.seq) == (4, 64)
    s = ptt.stats(m)
    assert 0 < s.dev_peak <= s.pred_peak, (s.dev_peak, s.pred_peak)


def test_plan_shape_checked():
    with pytest.raises(ValueError, match="plan_shape must be \\(batch, sequence\\)"):
        ptt.wrap(oracle.make_model("llama"), config=None, plan_shape=(0, 64))
