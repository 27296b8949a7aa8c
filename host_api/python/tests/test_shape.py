"""The plan is made for the batch shape the plugin profiled (pt_model_v1.batch
and .seq, from the first forward); the ABI has no re-plan hook, so a training
batch of another shape is refused with a sentence naming both shapes, before
any hook of that pass runs. Evaluation passes (no arena, no backward) take any
shape."""
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


@pytest.mark.parametrize("shape", [(2 * oracle.BATCH, oracle.SEQ), (oracle.BATCH, oracle.SEQ // 2),
                                   (oracle.BATCH - 1, oracle.SEQ)])
def test_training_batch_of_another_shape_is_refused(shape, ini, plugin_path):
    m, opt = _trained(ini, plugin_path)
    steps = ptt.stats(m).steps
    x = _batch(*shape)
    want = ("this training batch is batch %d x sequence %d, but the plan was profiled and made "
            "for batch %d x sequence %d" % (shape[0], shape[1], oracle.BATCH, oracle.SEQ))
    with pytest.raises(RuntimeError, match=want):
        m(input_ids=x, labels=x)
    # nothing of the refused pass reached the plugin: the profiled shape still trains
    x = _batch(oracle.BATCH, oracle.SEQ, seed=6)
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    assert ptt.stats(m).steps == steps + 1


def test_inputs_embeds_shape_is_checked(ini, plugin_path):
    """The shape is read from inputs_embeds too (batch x sequence x hidden)."""
    m, opt = ptt.wrap(oracle.make_model("llama"), config=ini(CKPT), plugin=plugin_path)
    emb = m.get_input_embeddings()
    x = _batch(oracle.BATCH, oracle.SEQ)
    with torch.no_grad():
        e = emb.weight[x].clone()
    m(inputs_embeds=e, labels=x).loss.backward()
    opt.step()
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
