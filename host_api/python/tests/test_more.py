"""bf16 parameters against fp32 master weights, the measured peak against the
plan's prediction, and LoRA (peft) on a frozen base."""
import copy

import pytest
import torch

import oracle
import protrain.torch as ptt
from test_oracle import STREAMED, check


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_against_fp32_master_reference(dtype, ini, plugin_path):
    """bf16 (fp16) forward/backward, AdamW on fp32 copies of the weights,
    rounded to the compute dtype after each step (what the plugin does with a
    half-precision compute copy): step-1 loss identical, every loss within 2e-3
    relative."""
    m = oracle.make_model("llama", dtype=dtype)
    ref = copy.deepcopy(m)
    data = oracle.batches(oracle.STEPS)
    params = list(ref.parameters())
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(master, lr=1e-3, weight_decay=0.0)
    want = []
    for x in data:
        loss = ref(input_ids=x, labels=x).loss
        loss.backward()
        for w, p in zip(master, params):
            w.grad = p.grad.float()
            p.grad = None
        opt.step()
        with torch.no_grad():
            for w, p in zip(master, params):
                p.copy_(w)
        want.append(loss.item())
    m, got = oracle.through_plugin(m, ini(STREAMED), data, plugin=plugin_path)
    assert got[0] == want[0]
    for a, b in zip(got, want):
        assert abs(a - b) <= 2e-3 * abs(b), (a, b)
    assert all(v.dtype == dtype for v in ptt.state_dict(m).values()
               if v.is_floating_point())


def test_measured_peak_within_prediction(ini, plugin_path):
    """A searched plan under a small capacity: the device peak the plugin
    measured (parameters, buffers, every packed activation arena) is at most
    the peak it predicted."""
    path = ini("[memory]\ndevice_capacity = 12MiB\n[protrain]\nchunk_size = 128KiB\n")
    m, got = oracle.through_plugin(oracle.make_model("llama"), path, oracle.batches(4),
                                   plugin=plugin_path)
    s = ptt.stats(m)
    print("llama 12MiB: measured peak %d, predicted %d, plan persist %d buffer %d swap %d "
          "ckpt %d of %d chunks" % (s.dev_peak, s.pred_peak, s.n_persist, s.n_buffer, s.n_swap,
                                    s.n_checkpoint, s.n_chunk))
    assert s.pred_peak > 0 and 0 < s.dev_peak <= s.pred_peak
    assert s.n_persist < s.n_chunk        # the capacity really forced offloading


def _lora(model):
    import peft
    cfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                          target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return peft.get_peft_model(model, cfg)


def test_lora_on_a_frozen_base(ini, plugin_path):
    torch.manual_seed(3)
    m = _lora(oracle.make_model("llama"))
    for name, p in m.named_parameters():        # adapters start non-zero, so step 1 moves
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    ref = copy.deepcopy(m)
    frozen0 = {k: v.detach().clone() for k, v in m.state_dict().items() if "lora_" not in k}
    data = oracle.batches(oracle.STEPS)
    want = oracle.reference(ref, data)
    m, got = oracle.through_plugin(m, ini(STREAMED), data, plugin=plugin_path)
    check(got, want, oracle.rel_norm(ptt.state_dict(m), ref.state_dict()))
    sd = ptt.state_dict(m)
    for k, v in frozen0.items():
        assert torch.equal(sd[k], v), "frozen %s was written" % k
    s = ptt.stats(m)
    infos = m._protrain.infos       # the parameters are placeholders outside their windows
    n_adapt = sum(torch.Size(i.shape).numel() for i in infos if i.trainable)
    n_base = sum(torch.Size(i.shape).numel() for i in infos if not i.trainable)
    # AdamW state for the adapters only: fp32 master + m + v = 12 bytes a trainable
    # element; the base has none (it would need 12 bytes each on top of its copy)
    print("LoRA: %d adapter elements (state 12 B each = %d B), %d frozen; pinned %d B, "
          "pinned arena %d B" % (n_adapt, 12 * n_adapt, n_base, s.pinned_current, s.pinned_arena))
    assert s.n_persist < s.n_chunk
    # pinned: the offloaded base's fp32 copy (4 B an element) plus the adapters'
    # state and staging; with AdamW state for the base it would be 16 B an element
    assert s.pinned_current < 4 * n_base + 6 * n_base
    assert n_adapt * 20 < n_base
