"""Tokens/s of a Hugging Face Llama trained through the plugin (resident and
streamed plans) against plain PyTorch with torch.optim.AdamW on the CPU, and the
adapter's own time per block per step (its hooks, the saved-tensor pack/unpack
and the plugin calls inside them). Goal: resident and streamed >= 0.97 of
plain PyTorch. PT_BENCH_STRICT=1 fails the run when the resident median is
below BAR (0.95), a bar for a gross regression: on the shared 2-core machine
a median of 9 pairs still moves by tenths between runs, so a bar at the goal
itself would pass or fail at random. The streamed median is reported against the goal but fails
nothing: its pairs spread from 0.7 to 1.6 under other jobs' load (its copy
threads compete with them), and its median sits near 0.95.
docs/benchmarks.md reports each run against the goal. Each arm's tokens
per CPU second of the whole process (all its threads) are reported besides:
under load from other jobs that ratio moves less than the wall-clock one,
and it counts the plugin's own threads' work, which the wall clock can hide.

The simulated device's poison (freed device memory filled with NaN, a
debugging aid a real GPU does not have) is off, as in bench_offload: with it
every freed activation arena is rewritten once per block per step, inside
block_post_backward (about 0.8 ms of CPU per block here).

usage: bench_torch.py [STEPS]   (PT_BUILD: the build folder with the plugin)"""
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import protrain.torch as ptt  # noqa: E402
from protrain import _acts, _adapter  # noqa: E402

L, HID, SEQ, BATCH, VOCAB = 4, 256, 128, 4, 1024
GOAL, BAR = 0.97, 0.95
TIMED = ("block_pre_forward", "block_post_forward", "block_pre_backward", "grad_accumulated",
         "_pack", "_unpack", "_recompute")
spent = [0.0, 0.0]    # adapter hooks in all; of which copies into arenas


def timed(fn, slot=0):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[slot] += time.perf_counter() - t
    return run


def model():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=L, hidden_size=HID, intermediate_size=4 * HID, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ, use_cache=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def run(m, opt, steps, warm=2):
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(steps + warm)]
    for i, x in enumerate(data):
        if i == warm:
            t0, c0, spent[0], spent[1] = time.perf_counter(), time.process_time(), 0.0, 0.0
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    dt = time.perf_counter() - t0
    return steps * BATCH * SEQ / dt, steps * BATCH * SEQ / (time.process_time() - c0)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    reps = int(os.environ.get("PT_BENCH_REPS", "5"))
    plugin = os.path.join(os.environ.get("PT_BUILD", os.path.join(HERE, "..", "..", "..", "build")),
                          "protrain_plugin.so")
    for name in TIMED:
        setattr(_adapter.Adapter, name, timed(getattr(_adapter.Adapter, name)))
    for name in ("store", "refill_one"):
        setattr(_acts.BlockActs, name, timed(getattr(_acts.BlockActs, name), 1))
    inis = {"resident": "[protrain]\nforce_all_persistent = true\n",
            "streamed": "[memory]\ndevice_capacity = 192MiB\n[protrain]\nauto_memory = false\n"
                        "n_persist = 0\nn_buffer = 12\nn_swap = 0\nn_checkpoint = 0\n"
                        "chunk_size = 512KiB\n"}
    pm = model()
    arms = {"plain": (pm, torch.optim.AdamW(pm.parameters(), lr=1e-4), None)}
    for name, text in inis.items():
        with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
            f.write("[plugin]\nbackend = host\nlog_level = error\n[host_backend]\npoison = false\n"
                    + text)
        m, opt = ptt.wrap(model(), config=f.name, lr=1e-4, plugin=plugin)
        os.unlink(f.name)
        arms[name] = (m, opt, name)
    # The arms alternate inside each repeat (the order rotates), and each ratio
    # is taken against the plain run of the same repeat, so a slow spell of a
    # shared machine touches one repeat's pair, not one arm; the median of the
    # repeats is reported.
    order = list(arms)
    ratios = {n: [] for n in inis}
    cpu_ratios = {n: [] for n in inis}
    hooks = {n: [] for n in inis}
    tps_all = {n: [] for n in arms}
    for r in range(reps):
        tps = {}
        for n in order[r % len(order):] + order[:r % len(order)]:
            m, opt, _ = arms[n]
            tps[n] = run(m, opt, steps)
            tps_all[n].append(tps[n][0])
            if n in inis:
                hooks[n].append((spent[0] / steps / L * 1e6, spent[1] / steps / L * 1e6))
        for n in inis:
            ratios[n].append(tps[n][0] / tps["plain"][0])
            cpu_ratios[n].append(tps[n][1] / tps["plain"][1])
    med = statistics.median
    print("plain PyTorch: %.0f tokens/s (median of %d)" % (med(tps_all["plain"]), reps))
    ok = True
    for n in inis:
        r = med(ratios[n])
        print("adapter %s: %.0f tokens/s, %.2f of plain PyTorch (median of %d alternating pairs; "
              "each: %s); adapter hooks %.0f us per block per step, of which %.0f us copying "
              "saved tensors into the arena"
              % (n, med(tps_all[n]), r, reps, " ".join("%.2f" % x for x in ratios[n]),
                 med(h[0] for h in hooks[n]), med(h[1] for h in hooks[n])))
        print("  tokens per CPU second (every thread of the process): %.3f of plain PyTorch "
              "(median; each: %s)" % (med(cpu_ratios[n]), " ".join("%.3f" % x for x in cpu_ratios[n])))
        if r < GOAL:
            print("  goal missed: %s >= %.2f of plain PyTorch%s"
                  % (n, GOAL, " (and below the strict bar %.2f)" % BAR
                     if n == "resident" and r < BAR else ""))
        if n == "resident" and r < BAR:
            ok = False
    for n in inis:
        ptt.finalize(arms[n][0])
    if not ok and os.environ.get("PT_BENCH_STRICT") == "1":
        sys.exit(1)


if __name__ == "__main__":
    main()
