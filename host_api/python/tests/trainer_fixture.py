"""Local stand-ins for what a real fine-tune downloads: a word-level tokenizer
built with the tokenizers library (saved like any Hugging Face tokenizer), a
seeded tiny causal LM, and texts of varying length (so batches pad to their
longest text). Nothing comes from the hub."""
import json
import os
import random

import torch

WORDS = ("the a model trains on small words and every step moves its weights toward lower "
         "loss while memory stays bounded by chunks that stream between host and device "
         "through one plugin").split()
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
VOCAB = 64          # >= len(SPECIALS) + len(set(WORDS))
UNK, BOS, EOS, PAD = 0, 1, 2, 3


def tokenizer(save_dir=None):
    """A PreTrainedTokenizerFast over WORDS (one id per word, <s> prepended);
    saved to save_dir when given (AutoTokenizer.from_pretrained loads it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(SPECIALS + sorted(set(WORDS)))}
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    if save_dir:
        fast.save_pretrained(save_dir)
    return fast


def texts(n, seed=7, lo=5, hi=40):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def write_jsonl(path, n, seed=7):
    with open(path, "w") as f:
        for t in texts(n, seed):
            f.write(json.dumps({"text": t}) + "\n")


def model(kind, seed=0):
    """A seeded 2-layer causal LM of the given family, fp32, no dropout, no cache."""
    import transformers as T
    torch.manual_seed(seed)
    common = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                  max_position_embeddings=128, bos_token_id=BOS, eos_token_id=EOS,
                  pad_token_id=PAD, use_cache=False)
    if kind == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(attention_dropout=0.0, **common))
    if kind == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**common))
    raise ValueError(kind)


def write_model(kind, save_dir, seed=0):
    """model(kind) and tokenizer() saved in one folder, as a hub checkpoint is."""
    os.makedirs(save_dir, exist_ok=True)
    model(kind, seed).save_pretrained(save_dir)
    tokenizer(save_dir)
    return save_dir


def rel_norm(a, b):
    """sqrt(sum |a-b|^2 / sum |b|^2) over the floating tensors of b (keys of a must cover b)."""
    num = den = 0.0
    for k, v in b.items():
        if not v.is_floating_point():
            continue
        num += float(((a[k].double() - v.double()) ** 2).sum())
        den += float((v.double() ** 2).sum())
    return (num / den) ** 0.5


def recording(trainer_cls):
    """trainer_cls whose compute_loss keeps each training micro-batch's loss
    unrounded in .losses (Trainers log 4 significant digits)."""
    class Recording(trainer_cls):
        losses = None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                       num_items_in_batch=num_items_in_batch)
            if model.training:
                loss = out[0] if return_outputs else out
                self.losses = (self.losses or []) + [float(loss.detach())]
            return out
    return Recording
