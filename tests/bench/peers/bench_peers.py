#!/usr/bin/env python3
"""bench_peers.py (make bench-peers): the same Hugging Face LlamaForCausalLM
(seeded random weights, bf16, the same batches) trained under

  torch     plain PyTorch, the whole model on the device (where it fits)
  fsdp2     FSDP2 fully_shard + CPUOffloadPolicy, one rank
  ds-z2     DeepSpeed ZeRO-2, offload_optimizer cpu (DeepSpeedCPUAdam)
  ds-z3     DeepSpeed ZeRO-3, offload_param + offload_optimizer cpu
  protrain  protrain through the PyTorch host (protrain.torch.wrap, auto plan)

at one device memory cap (torch.cuda.set_per_process_memory_fraction for the
peers, [memory] device_capacity for protrain) with the same AdamW settings.
Per system and model: tokens/s (median of the timed steps after warm-up),
TFLOPS, peak device memory, pinned host memory, the losses, and protrain's
predicted iteration time and peak beside the measured ones; then the largest
model of the 8B shape each system trains at the cap (bisection on the layer
count). One table at the end, also written as JSON and Markdown to --out.

Each system runs in its own process (protrain's CUDA allocator, once
installed, serves the whole process; an out-of-memory in one system must not
leave fragments for the next) with its own share of the time budget, printed
before it starts.

Without a GPU: a CPU rehearsal (the tiny model; protrain and plain PyTorch,
every other system reported as skipped with the reason) that checks the two
agree, and that the same check fails protrain at twice the lr (its negative
control); make test runs it (tests/bench_peers.sh). On a GPU the run exits 1
when protrain or plain PyTorch trained no model, or a system failed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True   # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)

SYSTEMS = ["torch", "fsdp2", "ds-ops", "ds-z2", "ds-z3", "protrain"]
# share of the budget per part on a GPU (their sum is 1): protrain runs the
# most (plan + profile per model); ds-ops is DeepSpeed's CPU Adam compiled
# just in time once, before the two ZeRO runs that use it
SHARE = {"torch": 0.08, "fsdp2": 0.16, "ds-ops": 0.12, "ds-z2": 0.18, "ds-z3": 0.18,
         "protrain": 0.28}


def gpu_tasks(args):
    """Per model: min seconds a part needs to start, max it may take."""
    t = []
    for m, lo, hi in (("1b", 15, 40), ("3b", 25, 60), ("8b", 45, 90)):
        if m in args.models:
            t.append(dict(model=m, kind="measure", warmup=args.warmup, steps=args.steps,
                          min_s=lo, max_s=hi))
    if args.bisect:
        t.append(dict(model="8b", kind="bisect", hi=args.bisect_hi, steps=2, min_s=30))
    return t


def cpu_tasks(args):
    t = [dict(model="tiny", kind="measure", warmup=1, steps=args.steps, min_s=1, max_s=30)]
    if args.bisect:
        t.append(dict(model="tiny", kind="bisect", hi=4, steps=1, min_s=2))
    return t


# The rehearsal's negative control: protrain once more at twice the lr; the
# loss check below must fail that run, or it could not catch a wrong update.
CONTROL = dict(model="tiny", kind="control", warmup=1, min_s=1, max_s=30, lr_scale=2.0)


def worker(args):
    import torch
    import peers_common as pc  # noqa: F401
    import peers_arms as arms
    cuda = torch.cuda.is_available() and not args.cpu
    ctx = dict(cuda=cuda, device="cuda" if cuda else "cpu", root=ROOT, out=args.out,
               cap=args.cap, wheels=args.wheels,
               deadline=time.perf_counter() + args.worker_budget)
    if cuda and args.system != "protrain":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap / total))
    torch.manual_seed(0)
    tasks = json.loads(args.tasks)
    arms.run_tasks(args.system, tasks, ctx, args.result)
    return 0


def run_system(system, args, tasks, budget, cuda):
    """Start the worker for one system with its budget; its rows from the
    result file (a worker killed at budget + grace keeps the rows it wrote)."""
    res = os.path.join(args.out, "rows_%s.jsonl" % system)
    if os.path.exists(res):
        os.remove(res)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--system", system,
           "--tasks", json.dumps(tasks), "--result", res, "--out", args.out,
           "--cap", str(args.cap), "--wheels", args.wheels, "--worker-budget", str(budget)]
    if not cuda:
        cmd.append("--cpu")
    env = dict(os.environ)
    b = os.environ.get("PT_BUILD", os.path.join(ROOT, "build"))
    env.setdefault("PROTRAIN_PLUGIN_PATH", b)   # the folder holding protrain_plugin.so
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    t0 = time.perf_counter()
    grace = 8   # a step that outruns the worker's own deadline
    status = "ok"
    try:
        r = subprocess.run(cmd, env=env, timeout=budget + grace)
        if r.returncode:
            status = "worker exit %d" % r.returncode
    except subprocess.TimeoutExpired:
        status = "killed at its budget (%d s + %d s grace)" % (budget, grace)
    rows = []
    if os.path.exists(res):
        with open(res) as f:
            rows = [json.loads(x) for x in f if x.strip()]
    return rows, status, time.perf_counter() - t0


def table(rows, cuda):
    import peers_common as pc
    head = ("| system | model | layers | params | status | tokens/s | TFLOPS | iter ms | "
            "pred iter ms | dev peak | pred peak | pinned | host RSS peak | loss first/last |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ls = r.get("losses") or []
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["system"], r["model"], r.get("layers", "-"),
            pc.fmt_params(r.get("params")),
            r["status"] + (" (%s)" % r["reason"] if r.get("reason") else ""),
            pc.fmt(r.get("tokens_s"), "%.0f"), pc.fmt(r.get("tflops"), "%.3f" if not cuda else "%.1f"),
            pc.fmt(r["iter_s"] * 1e3 if r.get("iter_s") else None, "%.1f"),
            pc.fmt(r["pred_iter_s"] * 1e3 if r.get("pred_iter_s") else None, "%.1f"),
            pc.fmt_bytes(r.get("dev_peak")), pc.fmt_bytes(r.get("pred_peak")),
            pc.fmt_bytes(r.get("pinned")), pc.fmt_bytes(r.get("host_rss_peak")),
            ("%.4f / %.4f" % (ls[0], ls[-1])) if ls else "-"))
    return "\n".join(out)


def agreement(rows):
    """Per model: the systems' losses after the same steps side by side, and
    the largest relative difference to the first system's, at step 1 and over
    all steps (bf16 noise grows with the steps, so it is printed, and only the
    rehearsal checks it)."""
    lines, worst = [], {}
    by = {}
    for r in rows:
        if r.get("kind") == "measure" and r.get("losses"):
            by.setdefault(r["model"], []).append(r)
    for m, rs in by.items():
        k = min(len(r["losses"]) for r in rs)
        ref = rs[0]["losses"]
        d = max(abs(r["losses"][i] - ref[i]) / abs(ref[i]) for r in rs for i in range(k))
        d1 = max(abs(r["losses"][0] - ref[0]) / abs(ref[0]) for r in rs)
        worst[m] = (d1, d)
        lines.append("losses over %d steps, %s: last %s; max relative difference %.2e (step 1: "
                     "%.2e)" % (k, m, ", ".join("%s %.6f" % (r["system"], r["losses"][k - 1])
                                                for r in rs), d, d1))
    return lines, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "peers"))
    ap.add_argument("--budget", type=float, default=320.0,
                    help="seconds for the whole run (shared among the systems)")
    ap.add_argument("--cap-gib", type=float, default=24.0, help="device memory cap on a GPU")
    ap.add_argument("--models", default="1b,3b,8b")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--steps", type=int, default=4, help="timed steps per part")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-bisect", dest="bisect", action="store_false")
    ap.add_argument("--bisect-hi", type=int, default=48, help="largest layer count tried")
    ap.add_argument("--cpu", action="store_true", help="the CPU rehearsal even with a GPU")
    ap.add_argument("--wheels", default=os.path.join(os.environ.get("PT_BUILD", os.path.join(ROOT, "build")), "wheels"))
    # worker side (one system per process)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--tasks", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--cap", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker-budget", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    if args.worker:
        return worker(args)

    t_start = time.perf_counter()
    import torch
    cuda = torch.cuda.is_available() and not args.cpu
    args.models = args.models.split(",")
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            ap.error("unknown system %r (want some of %s)" % (s, ",".join(SYSTEMS)))
    if cuda:
        dev = torch.cuda.get_device_name(0)
        args.cap = int(args.cap_gib * 2**30)
        tasks = gpu_tasks(args)
        mode = "GPU: %s, cap %.1f GiB" % (dev, args.cap_gib)
    else:
        dev = "cpu"
        args.cap = 256 * 2**20   # the host backend's simulated device for the rehearsal
        tasks = cpu_tasks(args)
        mode = "no GPU: CPU rehearsal (tiny Llama, simulated device of 256 MiB for protrain)"
    import peers_common as pc
    print("bench-peers: %s; budget %.0f s" % (mode, args.budget))
    print("  " + pc.FLOPS_FORMULA)
    print("  optimizer for every system: AdamW lr %g betas %s eps %g weight decay %g, clip %g, "
          "fp32 master weights and moments" % (3e-4, (0.9, 0.999), 1e-8, 0.0, 1.0))
    rows, timing = [], []
    # the rehearsal runs two systems: equal shares (its times are start-up)
    share = SHARE if cuda else {s: 1.0 for s in SYSTEMS}
    running = [s for s in systems if cuda or s in ("torch", "protrain")]
    left_share = sum(share[s] for s in running)
    for s in systems:
        if not cuda and s not in ("torch", "protrain"):
            reason = "no GPU: the rehearsal runs protrain and plain PyTorch only"
            if s.startswith("ds-z"):
                has = os.path.isdir(args.wheels) and any(f.startswith("deepspeed-")
                                                         for f in os.listdir(args.wheels))
                reason += "; DeepSpeed wheel %s" % ("present in " + args.wheels if has else
                                                    "missing (make peers-wheels)")
            rows.append(dict(system=s, model=tasks[0]["model"], kind="measure", status="skipped",
                             reason=reason))
            print("=== %s: skipped (%s)" % (s, reason))
            continue
        elapsed = time.perf_counter() - t_start
        budget = max(0.0, (args.budget - elapsed) * share[s] / left_share)
        left_share -= share[s]
        print("=== %s: budget %.0f s" % (s, budget), flush=True)
        mine = [dict(kind="build")] if s == "ds-ops" else tasks
        if not cuda and s == "protrain":
            mine = tasks + [dict(CONTROL, steps=args.steps)]
        got, status, took = run_system(s, args, mine, budget, cuda)
        if not got:
            got = [dict(system=s, model=tasks[0]["model"], kind="measure", status="failed",
                        reason=status)]
        rows += got
        timing.append((s, budget, took, status))
    print("=== time per part")
    for s, b, took, status in timing:
        print("  %-8s %6.1f s of %6.1f s budget  %s" % (s, took, b, status))
    md = table(rows, cuda)
    agree, worst = agreement(rows)
    print("=== results (%s)" % mode)
    print(md)
    for line in agree:
        print(line)
    total = time.perf_counter() - t_start
    print("bench-peers: %.1f s in all" % total)
    with open(os.path.join(args.out, "peers.json"), "w") as f:
        json.dump(dict(mode=mode, device=dev, cap=args.cap, budget_s=args.budget,
                       total_s=total, flops_formula=pc.FLOPS_FORMULA, rows=rows), f, indent=1)
    with open(os.path.join(args.out, "peers.md"), "w") as f:
        f.write("# bench-peers: %s\n\n%s\n\n%s\n\n%s\n" % (mode, pc.FLOPS_FORMULA, md,
                                                        "\n".join("- " + x for x in agree)))
    print("written: %s/peers.json, %s/peers.md" % (args.out, args.out))
    return rehearsal_check(rows, worst) if not cuda else gpu_check(rows)


def gpu_check(rows):
    """A GPU day ends red when what it came to measure did not run: protrain
    and plain PyTorch each trained at least one model (a peer out of memory at
    the cap, or skipped for a missing wheel, is a result, not a failure), every
    loss that was reported is finite, and no system failed."""
    import math
    bad = []
    ran = {r["system"] for r in rows if r.get("kind") == "measure" and r["status"] == "ok"}
    for s in ("protrain", "torch"):
        if s not in ran:
            bad.append("%s trained no model (its rows: %s)" % (s, ", ".join(
                "%s %s" % (r["model"], r["status"]) for r in rows if r["system"] == s) or "none"))
    for r in rows:
        if r.get("losses") and not all(math.isfinite(x) for x in r["losses"]):
            bad.append("%s %s: a loss is not finite" % (r["system"], r["model"]))
        if r["status"] == "failed":
            bad.append("%s %s failed: %s" % (r["system"], r["model"], r.get("reason")))
    for b in bad:
        print("bench-peers: FAIL: " + b)
    if not bad:
        print("bench-peers: OK (%s trained)" % ", ".join(sorted(ran)))
    return 1 if bad else 0


def rel_diffs(ref, other):
    """Step 1's and the largest relative loss difference of other to ref."""
    k = min(len(ref), len(other))
    d = max(abs(other[i] - ref[i]) / abs(ref[i]) for i in range(k))
    return abs(other[0] - ref[0]) / abs(ref[0]), d


def rehearsal_check(rows, worst):
    """The rehearsal's assertions: plain PyTorch ran; every system that ran
    trained (finite losses) and none failed; where protrain ran too, its losses
    match plain PyTorch's: step 1 within 1e-6 relative (the same bf16 forward on
    the same weights on the CPU), every step within 1e-4 (both step AdamW on
    fp32 master copies and round to bf16; two AdamW implementations may round a
    master weight 1 fp32 ulp apart, which can move its bf16 copy by one bf16 ulp,
    2^-8 of that weight, and the loss averages such flips over all weights;
    measured difference here: 0)."""
    import math
    bad = []
    ran = {r["system"] for r in rows if r.get("kind") == "measure" and r["status"] == "ok"}
    if "torch" not in ran:
        bad.append("plain PyTorch did not run")
    for r in rows:
        if r.get("losses") and not all(math.isfinite(x) for x in r["losses"]):
            bad.append("%s: a loss is not finite" % r["system"])
        if r["status"] == "failed":
            bad.append("%s failed: %s" % (r["system"], r.get("reason")))
    if "protrain" not in ran:
        bad.append("protrain did not train the tiny model (its rows: %s): nothing was compared"
                   % ", ".join(r["status"] for r in rows if r["system"] == "protrain"))
    elif "tiny" not in worst:
        bad.append("no losses of the tiny model to compare")
    else:
        d1, d = worst["tiny"]
        if not (d1 <= 1e-6 and d <= 1e-4):
            bad.append("protrain vs plain PyTorch: step-1 loss differs by %.2e (want <= 1e-6), "
                       "the steps by up to %.2e (want <= 1e-4)" % (d1, d))
    # the negative control: protrain at twice the lr must miss the same bound
    ref = [r for r in rows if r["system"] == "torch" and r.get("kind") == "measure"
           and r.get("losses")]
    ctl = [r for r in rows if r.get("kind") == "control" and r["status"] == "ok"
           and r.get("losses")]
    if not ref or not ctl:
        bad.append("the negative control (protrain at %g x lr) did not run" % CONTROL["lr_scale"])
    else:
        c1, c = rel_diffs(ref[0]["losses"], ctl[0]["losses"])
        print("bench-peers rehearsal: control, protrain at %g x lr: step-1 loss differs by "
              "%.2e, the steps by up to %.2e (the check must fail it)" % (CONTROL["lr_scale"], c1, c))
        if c1 <= 1e-6 and c <= 1e-4:
            bad.append("the loss check passes protrain at %g x lr (differences %.2e / %.2e): it "
                       "cannot tell a wrong update" % (CONTROL["lr_scale"], c1, c))
    for b in bad:
        print("bench-peers rehearsal: FAIL: " + b)
    if not bad:
        print("bench-peers rehearsal: OK (%s ran)" % ", ".join(sorted(ran)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
