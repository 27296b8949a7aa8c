"""The plan is made for the batch shape the plugin profiled (pt_model_v1.batch
and .seq, from the first forward); a smaller training batch trains on it, a
larger one is planned for first (replan). Evaluation passes (no arena, no
backward) take any shape. Dynamic shapes against plain PyTorch:
test_shapes_dynamic.py."""
import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import CKPT, RESIDENT, check


def _batch(batch, seq, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, oracle.VOCAB, (batch, seq), generator=g)


def _trained(ini, plugin_path, text=RESIDENT):
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(text), plugin=plugin_path)
    x = _batch(oracle.BATCH, oracle.SEQ)
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    return m, opt


@pytest.mark.parametrize("shape,replans", [((2 * oracle.BATCH, oracle.SEQ), 1),
                                           ((oracle.BATCH, oracle.SEQ // 2), 0),
                                           ((oracle.BATCH - 1, oracle.SEQ), 0)])
def test_training_batch_of_another_shape_trains(shape, replans, ini, plugin_path):
    """A smaller batch trains on the plan; a larger one is planned for first
    (under force_all_persistent replan records the shape) and becomes the
    plan's shape."""
    m, opt = _trained(ini, plugin_path)
    steps = ptt.stats(m).steps
    x = _batch(*shape)
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    ad = m._protrain
    assert ad.replans == replans
    assert ad.shape == (shape if replans else (oracle.BATCH, oracle.SEQ))
    x = _batch(oracle.BATCH, oracle.SEQ, seed=6)
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    assert ptt.stats(m).steps == steps + 2


def test_inputs_embeds_shape_is_read(ini, plugin_path):
    """The shape is read from inputs_embeds too (batch x sequence x hidden): a
    shorter one trains; with the shape frozen (the negative control) it is
    refused naming that shape."""
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(CKPT), plugin=plugin_path)
    emb = m.get_input_embeddings()
    x = _batch(oracle.BATCH, oracle.SEQ)
    with torch.no_grad():
        e = emb.weight[x].clone()
    m(inputs_embeds=e, labels=x).loss.backward()
    opt.step()
    m(inputs_embeds=e[:, :32], labels=x[:, :32]).loss.backward()
    opt.step()
    m._protrain.frozen_shape = True
    with pytest.raises(RuntimeError, match="batch 4 x sequence 32, but the plan was profiled"):
        m(inputs_embeds=e[:, :32], labels=x[:, :32])


def test_evaluation_of_another_shape_runs(ini, plugin_path):
    """Evaluation passes of another shape between training steps give plain
    PyTorch's losses (they ask for no arena), and training at the profiled
    shape goes on after them with the oracle's bounds."""
    import copy
    m0 = oracle.make_model("llama")
    ref = copy.deepcopy(m0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)
    m, opt = ptt.wrap(m0, config=ini(RESIDENT), lr=1e-3, weight_decay=0.0, max_grad_norm=0.0,
                      plugin=plugin_path)
    ev = _batch(2, oracle.SEQ // 2)
    got, want = [], []
    for y in oracle.batches(3):
        for mod, o, out in ((m, opt, got), (ref, ref_opt, want)):
            loss = mod(input_ids=y, labels=y).loss
            loss.backward()
            o.step()
            o.zero_grad()
            out.append(loss.item())
            with torch.no_grad():
                out.append(mod(input_ids=ev, labels=ev).loss.item())
    check(got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()))
