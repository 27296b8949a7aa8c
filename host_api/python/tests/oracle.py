"""The oracle: the same seeded model trained through the plugin and in plain
PyTorch (torch.optim.AdamW, same hyper-parameters, same batches)."""
import copy

import torch

import protrain.torch as ptt

VOCAB, SEQ, BATCH, STEPS = 512, 64, 4, 10


def make_model(kind, seed=0, dtype=torch.float32):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                         use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0)
        m = GPT2LMHeadModel(cfg)
    elif kind == "llama":
        cfg = LlamaConfig(num_hidden_layers=4, hidden_size=128, intermediate_size=256,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                          max_position_embeddings=SEQ, use_cache=False, bos_token_id=0,
                          eos_token_id=0, pad_token_id=0)
        m = LlamaForCausalLM(cfg)
    elif kind == "pythia":
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
        cfg = GPTNeoXConfig(num_hidden_layers=4, hidden_size=128, intermediate_size=512,
                            num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ,
                            use_cache=False, hidden_dropout=0.0, attention_dropout=0.0,
                            bos_token_id=0, eos_token_id=0)
        m = GPTNeoXForCausalLM(cfg)
    else:
        raise ValueError(kind)
    return m.to(dtype)


def batches(n, seed=1, batch=BATCH):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, SEQ), generator=g) for _ in range(n)]


def rel_norm(a, b):
    """sqrt(sum |a-b|^2 / sum |b|^2) over the floating tensors both dicts hold."""
    num = den = 0.0
    for k, v in b.items():
        if k in a and v.is_floating_point():
            num += float(((a[k].double() - v.double()) ** 2).sum())
            den += float((v.double() ** 2).sum())
    return (num / den) ** 0.5


def train_losses(model, data, grad_accum, step):
    """The mean loss of each optimizer step: grad_accum micro-batches of data,
    each loss scaled by 1/grad_accum before backward, then step()."""
    losses = []
    for s in range(0, len(data), grad_accum):
        tot = 0.0
        for x in data[s:s + grad_accum]:
            loss = model(input_ids=x, labels=x).loss
            (loss / grad_accum).backward()
            tot += loss.item()
        step()
        losses.append(tot / grad_accum)
    return losses


def reference(model, data, grad_accum=1, lr=1e-3, weight_decay=0.0, max_grad_norm=0.0,
              betas=(0.9, 0.999), eps=1e-8):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def step():
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        opt.zero_grad()
    return train_losses(model, data, grad_accum, step)


def through_plugin(model, ini, data, grad_accum=1, lr=1e-3, weight_decay=0.0, max_grad_norm=0.0,
                   plugin=None, setup=None, **kw):
    model, opt = ptt.wrap(model, config=ini, lr=lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, grad_accum=grad_accum,
                          plugin=plugin or "protrain", **kw)
    if setup:
        setup(model)
    return model, train_losses(model, data, grad_accum, opt.step)


def pair(kind, ini, plugin, steps=STEPS, grad_accum=1, freeze=None, setup=None, **hp):
    """(plugin losses, reference losses, relative weight error, wrapped model)."""
    m = make_model(kind)
    if freeze:
        freeze(m)
    ref = copy.deepcopy(m)
    data = batches(steps * grad_accum)
    want = reference(ref, data, grad_accum=grad_accum, **hp)
    m, got = through_plugin(m, ini, data, grad_accum=grad_accum, plugin=plugin, setup=setup, **hp)
    err = rel_norm(ptt.state_dict(m), ref.state_dict())
    return got, want, err, m
