"""peers_arms: one class per system bench_peers compares. Each builds its own
copy of the seeded model, runs training steps on the given batch, and says
what it holds; the worker (run_tasks) times them.

All systems: bf16 parameters, AdamW with fp32 master weights and fp32 moments,
the same lr / betas / eps / weight decay / clipping (OPT below)."""
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

import peers_common as pc

OPT = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)

# Host bytes per parameter each offloading system keeps (for the guard that
# skips a model the host cannot hold instead of letting the kernel kill it):
#   fsdp2: fp32 sharded params, fp32 grads, AdamW m and v on the CPU (16)
#   ds-z2: fp32 master, m, v, fp32 gradient partition on the CPU (16)
#   ds-z3: those plus the bf16 parameters themselves (18)
#   protrain: fp32 master, m, v for offloaded chunks (12) plus the bf16 initial
#             copy the host hands over and the chunk's compute copy (4)
HOST_BYTES_PER_PARAM = {"torch": 2, "fsdp2": 16, "ds-z2": 16, "ds-z3": 18, "protrain": 16}
HOST_FRACTION = 0.85


class Skip(Exception):
    """A system that cannot run here; the sentence says why."""


def is_oom(e):
    s = str(e)
    return (isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in s.lower()
            or "PT_ERR_OOM" in s or "INFEASIBLE" in s or "does not fit" in s)


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _one_rank_env():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                 ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)


class TorchArm:
    """Plain PyTorch: the whole model on the device; bf16 forward/backward,
    AdamW over fp32 master copies (the gradient widened, the result rounded
    back into the bf16 parameter)."""
    name = "torch"

    def __init__(self, spec, layers, ctx):
        dev = ctx["device"]
        self.model = pc.build_model(spec, layers, torch.bfloat16, dev)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        self.opt = torch.optim.AdamW(self.master, lr=OPT["lr"], betas=OPT["betas"],
                                     eps=OPT["eps"], weight_decay=OPT["weight_decay"])

    def step(self, ids):
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        for m, p in zip(self.master, self.params):
            m.grad = p.grad.float()
            p.grad = None
        if OPT["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(self.master, OPT["max_grad_norm"])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, p in zip(self.master, self.params):
                p.copy_(m)
        return float(loss.detach())

    def close(self):
        self.model = self.params = self.master = self.opt = None


class FsdpArm:
    """FSDP2 fully_shard with CPUOffloadPolicy on one rank: fp32 sharded
    parameters and the optimizer on the CPU, bf16 compute on the GPU
    (MixedPrecisionPolicy), every decoder layer its own unit; HF gradient
    checkpointing on (what an offloading user turns on)."""
    name = "fsdp2"

    def __init__(self, spec, layers, ctx):
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        _one_rank_env()
        if not dist.is_initialized():
            dist.init_process_group("nccl" if ctx["cuda"] else "gloo")
        model = pc.build_model(spec, layers, torch.float32, "cpu")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        off = CPUOffloadPolicy(pin_memory=True)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=OPT["lr"], betas=OPT["betas"],
                                     eps=OPT["eps"], weight_decay=OPT["weight_decay"])

    def step(self, ids):
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        if OPT["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), OPT["max_grad_norm"])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def close(self):
        self.model = self.opt = None


def ensure_deepspeed(wheels):
    """deepspeed, imported; installed first from the wheels of make peers-wheels
    into a temporary folder appended to sys.path (the machine's own packages
    keep precedence) when this Python lacks it. Raises Skip naming what is
    missing."""
    try:
        import deepspeed  # noqa: F401
        return deepspeed
    except ImportError:
        pass
    whl = sorted(f for f in os.listdir(wheels) if f.endswith(".whl")) if os.path.isdir(wheels) else []
    if not any(f.startswith("deepspeed-") for f in whl):
        raise Skip("deepspeed is not installed and %s holds no deepspeed wheel (make peers-wheels "
                   "builds it)" % wheels)
    target = tempfile.mkdtemp(prefix="peers_site_")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--target", target] + [os.path.join(wheels, f) for f in whl]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise Skip("installing the wheels of %s failed: %s" % (wheels, (r.stderr or r.stdout)[-300:]))
    sys.path.append(target)
    import deepspeed
    return deepspeed


class DeepSpeedArm:
    """DeepSpeed ZeRO with the optimizer on the CPU (DeepSpeedCPUAdam, fp32
    master and moments there), bf16 on the GPU; stage 3 also keeps the
    parameters on the CPU. HF gradient checkpointing on."""

    def __init__(self, spec, layers, ctx, stage):
        if not ctx["cuda"]:
            raise Skip("DeepSpeed's offload needs a CUDA device")
        ds = ensure_deepspeed(ctx["wheels"])
        _one_rank_env()
        self.name = "ds-z%d" % stage
        zero = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "overlap_comm": True, "contiguous_gradients": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        cfg = {"train_micro_batch_size_per_gpu": spec["batch"], "gradient_accumulation_steps": 1,
               "bf16": {"enabled": True}, "zero_optimization": zero,
               "optimizer": {"type": "AdamW", "params": {
                   "lr": OPT["lr"], "betas": list(OPT["betas"]), "eps": OPT["eps"],
                   "weight_decay": OPT["weight_decay"]}},
               "gradient_clipping": OPT["max_grad_norm"], "steps_per_print": 10**9,
               "wall_clock_breakdown": False}
        model = pc.build_model(spec, layers, torch.bfloat16, "cpu")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(),
                                             config=cfg)

    def step(self, ids):
        loss = self.engine(input_ids=ids, labels=ids).loss
        self.engine.backward(loss)
        self.engine.step()
        return float(loss.detach())

    def close(self):
        if getattr(self, "engine", None) is not None:
            try:
                self.engine.destroy()
            except Exception:
                pass
        self.engine = None


def import_protrain(root):
    """protrain.torch from host_api/python ($PROTRAIN_PY_PATH: another folder
    holding the package); Skip when the package is not there."""
    pkg = os.environ.get("PROTRAIN_PY_PATH") or os.path.join(root, "host_api", "python")
    if not os.path.isfile(os.path.join(pkg, "protrain", "torch.py")):
        raise Skip("host_api/python not built (no protrain.torch package)")
    if pkg not in sys.path:
        sys.path.insert(0, pkg)
    try:
        import protrain.torch as ptt
    except ImportError as e:
        raise Skip("host_api/python not built (import protrain.torch: %s)" % e)
    return ptt


class ProtrainArm:
    """protrain through the PyTorch host (protrain.torch.wrap), auto plan at the
    cap ([memory] device_capacity); its plan's predicted iteration time and
    peak are read from the plan file and the plugin's counters."""
    name = "protrain"

    def __init__(self, spec, layers, ctx):
        ptt = import_protrain(ctx["root"])
        self.ptt = ptt
        d = tempfile.mkdtemp(prefix="peers_protrain_", dir=ctx["out"])
        self.plan_file = os.path.join(d, "plan.json")
        ini = os.path.join(d, "protrain.ini")
        with open(ini, "w") as f:
            f.write("[plugin]\nbackend = %s\nlog_level = warn\n" % ("cuda" if ctx["cuda"] else "host"))
            f.write("[memory]\ndevice_capacity = %d\n" % ctx["cap"])
            f.write("[protrain]\nplan_file = %s\n" % self.plan_file)
        if ctx["cuda"] and not ctx.get("protrain_init"):
            init = getattr(ptt, "init", None)
            if init is None:
                raise Skip("protrain.torch has no init(config) (needed before CUDA allocations)")
            init(ini)
            ctx["protrain_init"] = True
        model = pc.build_model(spec, layers, torch.bfloat16, "cpu")
        # lr_scale: the rehearsal's negative control (bench_peers.py) trains at
        # another lr, which its loss check must tell apart
        lr = OPT["lr"] * ctx.get("lr_scale", 1.0)
        self.model, self.opt = ptt.wrap(model, config=ini, lr=lr, betas=OPT["betas"],
                                        eps=OPT["eps"], weight_decay=OPT["weight_decay"],
                                        max_grad_norm=OPT["max_grad_norm"], grad_accum=1)

    def step(self, ids):
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return float(loss.detach())

    def readings(self):
        """Predicted iteration time and peak (plan file, else counters), the
        plugin's measured device peak and pinned bytes."""
        r = {}
        try:
            with open(self.plan_file) as f:
                plan = json.load(f)
            cost = plan.get("cost", plan)
            r["pred_iter_s"] = cost.get("iter_s")
            r["pred_peak"] = cost.get("peak_bytes")
        except (OSError, ValueError):
            pass
        stats = getattr(self.ptt, "stats", None)
        if stats is not None:
            s = stats(self.model)
            r["dev_peak"] = getattr(s, "dev_peak", None)
            r["pinned"] = getattr(s, "pinned_current", None)
            if r.get("pred_iter_s") is None:
                r["pred_iter_s"] = getattr(s, "pred_iter_s", None)
            if r.get("pred_peak") is None:
                r["pred_peak"] = getattr(s, "pred_peak", None)
        return r

    def close(self):
        fin = getattr(self.ptt, "finalize", None)
        if fin is not None and self.model is not None:
            try:
                fin(self.model)
            except Exception:
                pass
        self.model = self.opt = None


def make_arm(system, spec, layers, ctx):
    if system == "torch":
        return TorchArm(spec, layers, ctx)
    if system == "fsdp2":
        if not ctx["cuda"]:
            raise Skip("no GPU: the rehearsal runs protrain and plain PyTorch only")
        return FsdpArm(spec, layers, ctx)
    if system in ("ds-z2", "ds-z3"):
        if not ctx["cuda"]:
            raise Skip("no GPU: the rehearsal runs protrain and plain PyTorch only")
        return DeepSpeedArm(spec, layers, ctx, int(system[-1]))
    if system == "protrain":
        return ProtrainArm(spec, layers, ctx)
    raise ValueError("unknown system %r" % system)


def _sync(ctx):
    if ctx["cuda"]:
        torch.cuda.synchronize()


def _cuda_stats(ctx, system, reset=False):
    """The caching allocator's peaks (reset first when asked). Not for
    protrain: its allocator must be installed before anything touches the
    caching allocator (empty_cache included), and keeps no such statistics;
    its own counters (readings) give the peak."""
    if not ctx["cuda"] or system == "protrain":
        return {}
    try:
        if reset:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            return {}
        return dict(dev_peak=torch.cuda.max_memory_allocated(),
                    dev_reserved_peak=torch.cuda.max_memory_reserved())
    except RuntimeError:
        return {}


def build_ds_ops(ctx):
    """DeepSpeed's CPU Adam, compiled just in time once (cached for both ZeRO
    runs), so its compile time is its own part and not ZeRO-2's."""
    row = dict(system="ds-ops", model="-", kind="build", layers=None)
    t0 = time.perf_counter()
    try:
        ensure_deepspeed(ctx["wheels"])
        from deepspeed.ops.op_builder import CPUAdamBuilder
        CPUAdamBuilder().load()
        row.update(status="ok", reason="DeepSpeedCPUAdam built (just in time)")
    except Skip as e:
        row.update(status="skipped", reason=str(e))
    except Exception as e:
        row.update(status="failed", reason="%s: %s" % (type(e).__name__, str(e)[:300]))
    row["time_s"] = time.perf_counter() - t0
    return row


def run_one(system, task, ctx):
    """One model under one system: warm-up steps, then timed steps (until the
    task's deadline). Returns the result row."""
    spec = dict(pc.SPECS[task["model"]])
    spec["batch"] = task.get("batch", spec["batch"])
    layers = task.get("layers", spec["layers"])
    row = dict(system=system, model=task["model"], layers=layers, kind=task["kind"],
               params=pc.n_params(spec, layers), batch=spec["batch"], seq=spec["seq"])
    need = HOST_BYTES_PER_PARAM[system] * row["params"]
    if need > HOST_FRACTION * pc.host_mem_total():
        row.update(status="skipped", reason="host memory: ~%d B/param = %.0f GiB > %.0f%% of %.0f GiB"
                   % (HOST_BYTES_PER_PARAM[system], need / 2**30, 100 * HOST_FRACTION,
                      pc.host_mem_total() / 2**30))
        return row
    if task.get("lr_scale", 1.0) != 1.0:
        row["lr_scale"] = task["lr_scale"]
    ctx["lr_scale"] = task.get("lr_scale", 1.0)
    t0 = time.perf_counter()
    arm = None
    _cuda_stats(ctx, system, reset=True)
    try:
        arm = make_arm(system, spec, layers, ctx)
        row["setup_s"] = time.perf_counter() - t0
        data = pc.batches(spec, task["warmup"] + task["steps"], ctx["device"])
        losses, times = [], []
        for i, ids in enumerate(data):
            if i >= task["warmup"] and time.perf_counter() > task["deadline"] and times:
                break
            s0 = time.perf_counter()
            losses.append(arm.step(ids))
            _sync(ctx)
            if i >= task["warmup"]:
                times.append(time.perf_counter() - s0)
        row.update(status="ok", losses=losses, step_s=times)
        if times:
            it = pc.median(times)
            row["iter_s"] = it
            row["tokens_s"] = spec["batch"] * spec["seq"] / it
            row["tflops"] = row["tokens_s"] * pc.flops_per_token(spec, layers) / 1e12
        row.update(_cuda_stats(ctx, system))
        row["pinned"] = pc.pinned_bytes()
        if hasattr(arm, "readings"):
            row.update({k: v for k, v in arm.readings().items() if v is not None})
    except Skip as e:
        row.update(status="skipped", reason=str(e))
    except Exception as e:  # a system's failure is its row, not the benchmark's end
        row.update(status="oom" if is_oom(e) else "failed",
                   reason="%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else ""))
    finally:
        if arm is not None:
            arm.close()
        arm = None
        gc.collect()   # a failed step's frames and an engine's cycles hold device memory
    row["host_rss_peak"] = pc.host_rss_peak()
    row["time_s"] = time.perf_counter() - t0
    return row


def run_tasks(system, tasks, ctx, result_file):
    """The worker: each task in order, each row appended to result_file as
    soon as it is known (a worker killed at its budget keeps what it did). A
    task with too little time left before the worker's deadline is skipped;
    a bisection task asks for the next layer count from the rows so far."""
    rows = []

    def emit(row):
        rows.append(row)
        with open(result_file, "a") as f:
            f.write(json.dumps(row) + "\n")
        print("  %-8s %-5s %-8s L=%-3s %s%s" % (
            system, row["model"], row["kind"], row["layers"], row["status"],
            (" %.0f tok/s" % row["tokens_s"]) if row.get("tokens_s") else
            (" (%s)" % row.get("reason", "")) if row.get("reason") else ""), flush=True)

    for task in tasks:
        if task["kind"] == "build":
            emit(build_ds_ops(ctx))
            continue
        if task["kind"] == "bisect":
            bisect(system, task, ctx, emit)
            continue
        left = ctx["deadline"] - time.perf_counter()
        if left < task["min_s"]:
            emit(dict(system=system, model=task["model"], kind=task["kind"],
                      layers=task.get("layers", pc.SPECS[task["model"]]["layers"]),
                      status="skipped", reason="time budget (%.0f s left, wants %d)" %
                      (max(left, 0), task["min_s"])))
            continue
        task["deadline"] = min(ctx["deadline"], time.perf_counter() + task["max_s"])
        row = run_one(system, task, ctx)
        emit(row)
        if row["status"] == "skipped" and not row["reason"].startswith("host memory"):
            break   # the system cannot run here at all (the row says why)
    return rows


def bisect(system, task, ctx, emit):
    """Largest layer count of task's shape that trains (task['steps'] steps
    without running out of memory), by bisection in [1, hi]: lo fits, hi+1
    is unknown until tried. Each probe is a row; the last row says the result."""
    lo, hi = 0, task["hi"]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ctx["deadline"] - time.perf_counter() < task["min_s"]:
            break
        t = dict(task, kind="probe", layers=mid, warmup=1, steps=task["steps"],
                 deadline=ctx["deadline"])
        row = run_one(system, t, ctx)
        emit(row)
        if row["status"] == "ok":
            lo = mid
        elif row["status"] == "oom" or (row["status"] == "skipped" and
                                        row.get("reason", "").startswith("host memory")):
            hi = mid - 1
        else:   # a failure or a skip that says nothing about the size: stop
            emit(dict(system=system, model=task["model"], kind="largest", layers=None,
                      status=row["status"], reason="search stopped at %d layers: %s" %
                      (mid, row.get("reason", ""))))
            return
    spec = pc.SPECS[task["model"]]
    note = "" if ctx["cuda"] else "; CPU rehearsal: no device cap, this only exercises the search"
    emit(dict(system=system, model=task["model"], kind="largest", layers=lo,
              params=pc.n_params(spec, lo) if lo else 0,
              status="ok" if lo == hi else "partial" if lo else "none",
              reason="searched [1, %d], bracket [%d, %d]%s%s" % (
                  task["hi"], lo, hi, "" if lo == hi else " (time budget)", note)))
