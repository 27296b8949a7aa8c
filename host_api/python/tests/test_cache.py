"""use_cache=True (the transformers default) is handled: training passes run
without a cache (the same losses and weights as plain PyTorch), generation
keeps it (the same tokens as a plain model with the trained weights). The
control is test_errors.test_kv_cache_in_training: with use_cache kept in
training the block refuses the cache."""
import copy

import torch

import oracle
import protrain.torch as ptt
from test_oracle import STREAMED, check


def test_use_cache_true_trains_and_generates(ini, plugin_path):
    from transformers import LlamaForCausalLM
    m = oracle.make_model("llama")
    m.config.use_cache = True
    ref = copy.deepcopy(m)
    data = oracle.batches(3)
    want = oracle.reference(ref, data)
    m, got = oracle.through_plugin(m, ini(STREAMED), data, plugin=plugin_path)
    check(got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()))
    plain = LlamaForCausalLM(m.config)
    plain.load_state_dict(ptt.state_dict(m))
    x = data[0][:1, :8]
    with torch.no_grad():
        out = m(input_ids=x, use_cache=True)
    assert out.past_key_values is not None and out.past_key_values.get_seq_length() == 8
    a = m.generate(x, max_new_tokens=4, do_sample=False)
    b = plain.generate(x, max_new_tokens=4, do_sample=False)
    assert a.shape == (1, 12) and torch.equal(a, b)
    again = oracle.batches(1, seed=7)[0]
    loss = m(input_ids=again, labels=again).loss      # training goes on after generation
    loss.backward()
