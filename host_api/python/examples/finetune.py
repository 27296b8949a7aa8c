"""Fine-tune a Hugging Face causal LM through protrain_plugin.so.

usage: finetune.py MODEL CONFIG.ini TEXT_FILE [STEPS] [OUT_DIR]
MODEL is a local model directory (weights + tokenizer) or a config.json
(random weights; the text's bytes are the tokens)."""
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import protrain.torch as ptt

src, ini, text = sys.argv[1:4]
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 20
if src.endswith(".json"):
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
    ids = torch.tensor(list(open(text, "rb").read())) % model.config.vocab_size
else:
    model = AutoModelForCausalLM.from_pretrained(src)
    ids = AutoTokenizer.from_pretrained(src)(open(text).read(), return_tensors="pt").input_ids[0]
model, opt = ptt.wrap(model, config=ini, lr=1e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
for step in range(steps):
    x = torch.stack([ids[s:s + 64] for s in torch.randint(0, len(ids) - 64, (4,)).tolist()])
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # the plugin's global norm
    opt.step()
    sched.step()
    print("step %d loss %.4f lr %.2e" % (step, loss.item(), sched.get_last_lr()[0]), flush=True)
if len(sys.argv) > 5:
    model.save_pretrained(sys.argv[5])
