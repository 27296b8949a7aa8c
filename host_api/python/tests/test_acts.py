"""Saved activations by activation mode (protrain/_acts.py): the adapter takes
each block's mode from the plan's counts, or learns it on the plan's first
training pass when the counts mix modes, and copies only what the plan moves.
The numbers are the oracle's (test_oracle.py runs the
same configurations against plain PyTorch); here: which mode each block got,
that nothing is copied where nothing moves, and that the adapter refuses to
run on modes the plan no longer has."""
import pytest

import oracle
import protrain.torch as ptt
from protrain import _acts
from test_oracle import CKPT, RESIDENT, STREAMED, SWAP, check

# one SWAP block, one CKPT block, two NONE: the adapter has to learn which
MIXED = ("[protrain]\nauto_memory = false\nn_persist = 1000\nn_buffer = 0\nn_swap = 1\n"
         "n_checkpoint = 1\n")
EXPECT = {"resident": (RESIDENT, _acts.REF), "streamed": (STREAMED, _acts.REF),
          "ckpt": (CKPT, _acts.META), "swap": (SWAP, _acts.COPY), "mixed": (MIXED, "learned")}


def _copied_bytes(m):
    """Wrap BlockActs.store on this model's blocks to count the bytes it copies."""
    seen = [0]
    for acts in m._protrain.acts:
        store = acts.store

        def counted(base, acts=acts, store=store):
            seen[0] += sum(acts.layout[i][4] * acts.layout[i][1].itemsize
                           for i, _ in acts.pending)
            return store(base)
        acts.store = counted
    return seen


@pytest.mark.parametrize("case", list(EXPECT))
def test_modes_follow_the_plan(case, ini, plugin_path):
    """NONE blocks keep autograd's tensors, CKPT blocks keep only the layout
    (neither copies), SWAP blocks copy; a mixed plan copies every block on its
    learning pass only; the oracle holds in each."""
    text, want_mode = EXPECT[case]
    counter = {}

    def setup(m):
        counter["seen"] = _copied_bytes(m)
    got, want, err, m = oracle.pair("llama", ini(text), plugin_path, setup=setup)
    check(got, want, err)
    ad = m._protrain
    s = ptt.stats(m)
    # every block's forward asked its arena for the bytes it laid out
    assert all(a.total > 0 for a in ad.acts)
    per_pass = sum(a.total for a in ad.acts)
    copied = counter["seen"][0]
    if case != "mixed":
        # the counts leave no choice: no learning pass; only SWAP copies
        assert ad.act_modes == [want_mode] * ad.L, ad.act_modes
        if want_mode is _acts.COPY:
            assert copied >= oracle.STEPS * per_pass // 2
        else:
            assert copied == 0
        # a recompute's tensors are let go with the block's backward window
        assert all(a.kept == [] for a in ad.acts)
    else:
        assert (s.n_swap, s.n_checkpoint) == (1, 1)
        assert ad.act_modes.count(_acts.COPY) == 1 and ad.act_modes.count(_acts.META) == 1
        assert ad.act_modes.count(_acts.REF) == 2
        # the learning pass copies every block, later passes the SWAP block only
        swap = ad.acts[ad.act_modes.index(_acts.COPY)].total
        assert per_pass // 2 <= copied - (oracle.STEPS - 1) * swap <= per_pass, (copied, swap)


def test_checkpointed_block_not_recomputed_is_refused(ini, plugin_path):
    """The adapter believes a block is CKPT (dropped its forward's tensors)
    but the plugin keeps the arena and recomputes nothing: the backward is
    refused with a sentence rather than reading an arena nobody wrote."""
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(RESIDENT), plugin=plugin_path)
    data = oracle.batches(3)
    for x in data[:2]:
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
    ad = m._protrain
    assert ad.act_modes == [_acts.REF] * ad.L
    ad.act_modes = [_acts.META] * ad.L        # a mode map the plan does not have
    loss = m(input_ids=data[2], labels=data[2]).loss
    with pytest.raises(RuntimeError, match="block 3 was checkpointed .* did not recompute it"):
        loss.backward()


@pytest.mark.parametrize("case", ["resident", "streamed"])
def test_parameter_view_outside_its_window(case, ini, plugin_path):
    """A saved view of a parameter (weight.t()) is re-made at the parameter's
    address in the block's backward window; read after block_post_backward
    (the switch that closes a block at its first accumulated gradient, while
    its other linear layers still have their backward to run) it is refused:
    streamed, the plugin has taken the address back; resident, the address is
    still there but outside the window the ABI gives it."""
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(EXPECT[case][0]),
                      plugin=plugin_path)
    data = oracle.batches(3)
    for x in data[:2]:
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
    m._protrain.skip_post_backward_wait = True
    loss = m(input_ids=data[2], labels=data[2]).loss
    with pytest.raises(RuntimeError, match="saved view of .* outside its backward window"):
        loss.backward()


def test_plan_change_learns_again(ini, plugin_path):
    """A changed plan signature (what a re-plan changes) makes the next pass
    copy everything and learn the modes again (a mixed plan, where the counts
    do not say which block is which)."""
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(MIXED), plugin=plugin_path)
    data = oracle.batches(3)
    for x in data[:2]:
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
    ad = m._protrain
    learned = list(ad.act_modes)
    assert not ad.learning and _acts.COPY in learned and _acts.REF in learned
    seen = _copied_bytes(m)
    ad.plan_sig = None
    x = data[2]
    loss = m(input_ids=x, labels=x).loss
    assert ad.act_modes == [_acts.COPY] * ad.L and ad.learning
    assert seen[0] >= sum(a.total for a in ad.acts) // 2
    loss.backward()
    opt.step()
    assert ad.act_modes == learned and not ad.learning
