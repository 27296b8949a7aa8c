"""peers_common: what every system of bench_peers shares: the Llama shapes, the
seeded weights and batches, the FLOP count and the memory readings."""
import math
import resource
import zlib

import torch

# Llama shapes (the public 1B / 3B / 8B configurations' dimensions). batch is
# the micro-batch of that model in the benchmark (sequences of `seq` tokens).
SPECS = {
    "1b": dict(hidden=2048, inter=8192, layers=16, heads=32, kv=8, vocab=128256, tie=True,
               batch=4, seq=1024),
    "3b": dict(hidden=3072, inter=8192, layers=28, heads=24, kv=8, vocab=128256, tie=True,
               batch=2, seq=1024),
    "8b": dict(hidden=4096, inter=14336, layers=32, heads=32, kv=8, vocab=128256, tie=False,
               batch=1, seq=1024),
    # the CPU rehearsal's model: the same code paths, seconds on two cores
    "tiny": dict(hidden=64, inter=176, layers=2, heads=4, kv=2, vocab=256, tie=False,
                 batch=2, seq=32),
}

SEED = 1234
INIT_STD = 0.02


def n_params(spec, layers=None):
    """All parameters of the Llama shape (embedding and head counted once each,
    once in all when tied)."""
    L = spec["layers"] if layers is None else layers
    H, I, V = spec["hidden"], spec["inter"], spec["vocab"]
    hd = H // spec["heads"]
    attn = H * H + 2 * H * spec["kv"] * hd + H * H       # q, k, v, o
    per_layer = attn + 3 * H * I + 2 * H                 # gate, up, down; two norms
    emb = V * H * (1 if spec["tie"] else 2)
    return emb + L * per_layer + H


def flops_per_token(spec, layers=None):
    """Training FLOPs per token: 6 N_mm + 12 L H T. N_mm counts the parameters
    that enter matrix products (every layer weight and the head; not the input
    embedding, a lookup): 2 FLOPs per parameter forward, 4 backward. The
    attention scores and their weighted sum are 2 products of T x H per token
    and layer (4 L H T forward, 8 backward); the causal mask's skipped half and
    any recompute are not counted."""
    L = spec["layers"] if layers is None else layers
    H, V, T = spec["hidden"], spec["vocab"], spec["seq"]
    n_mm = n_params(spec, L) - V * H * (0 if spec["tie"] else 1) - (2 * L + 1) * H
    return 6 * n_mm + 12 * L * H * T


FLOPS_FORMULA = ("TFLOPS = tokens/s x (6 N_mm + 12 L H T) / 1e12; N_mm = parameters in matrix "
                 "products (head included, input embedding and norms not), L layers, H hidden, "
                 "T sequence; recompute not counted")


def llama_config(spec, layers=None):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["inter"],
        num_hidden_layers=spec["layers"] if layers is None else layers,
        num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"],
        max_position_embeddings=max(spec["seq"], 128), tie_word_embeddings=spec["tie"],
        rms_norm_eps=1e-5, attention_dropout=0.0, use_cache=False)


BASE_LEN = 1 << 24
_base = None


def _fill(p, name):
    """Every system starts from the same weights, whatever order it builds in
    and wherever its parameters live: matrices are read from one seeded normal
    vector (std 0.02) of 2^24 values at an offset given by the parameter's
    name, repeated to the parameter's length; the norms' scales are 1. Drawn
    once on the CPU: no CUDA allocation happens before a system sets its
    allocator up (protrain's must come first), and a 7-8B model fills at copy
    speed (a fresh normal draw per element would take over a minute there).
    The repetition makes the matrices low-rank, which changes no timing."""
    global _base
    if p.dim() == 1:
        p.fill_(1.0)
        return
    if _base is None:
        g = torch.Generator().manual_seed(SEED)
        _base = torch.randn(2 * BASE_LEN, generator=g).mul_(INIT_STD)
    off = zlib.crc32(name.encode()) % BASE_LEN
    flat = p.view(-1)
    for start in range(0, flat.numel(), BASE_LEN):
        k = min(BASE_LEN, flat.numel() - start)
        flat[start:start + k].copy_(_base[off:off + k])


def build_model(spec, layers=None, dtype=torch.bfloat16, device="cpu"):
    """LlamaForCausalLM with seeded random weights, parameters in `dtype` on
    `device`, built on the meta device first (no default initialisation)."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama import modeling_llama
    cfg = llama_config(spec, layers)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _fill(p, name)
    # to_empty leaves buffers uninitialised: the rotary table is rebuilt
    model.model.rotary_emb = modeling_llama.LlamaRotaryEmbedding(cfg).to(device)
    if spec["tie"]:
        model.tie_weights()
    model.train()
    return model


def batches(spec, n, device):
    """n seeded (input_ids, labels) batches of spec's micro-batch and sequence."""
    g = torch.Generator().manual_seed(SEED)
    out = []
    for _ in range(n):
        ids = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"]), generator=g)
        out.append(ids.to(device))
    return out


def host_rss_peak():
    """Peak resident host bytes of this process (the kernel's high-water mark)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def host_mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def pinned_bytes():
    """Pinned host bytes held by PyTorch's caching host allocator (pin_memory()
    tensors: DeepSpeed's and FSDP2's offload buffers), or None where this
    PyTorch does not report them."""
    if not torch.cuda.is_available():
        return None
    f = getattr(torch.cuda, "host_memory_stats", None)
    if f is None:
        return None
    try:
        s = f()
    except Exception:
        return None
    for k in ("allocated_bytes.current", "reserved_bytes.current", "allocated_bytes"):
        v = s.get(k)
        if isinstance(v, dict):
            v = v.get("current")
        if v is not None:
            return int(v)
    return None


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return float("nan")
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def fmt_bytes(x):
    if x is None:
        return "-"
    return "%.2f GiB" % (x / 2**30) if x >= 2**30 else "%.1f MiB" % (x / 2**20)


def fmt(x, spec="%.2f"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return spec % x


def fmt_params(n):
    if not n:
        return "-"
    return "%.2fB" % (n / 1e9) if n >= 1e8 else "%.2fM" % (n / 1e6)
