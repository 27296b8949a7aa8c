"""axolotl's own CLI (python -m axolotl.cli.train) on the CPU, with and without
`plugins: [protrain.axolotl.ProTrainPlugin]`: a tiny local Llama and a local
word-level tokenizer (trainer_fixture, nothing from the hub), a local jsonl of
texts of 5..40 words, LoRA on every linear layer, sample packing with dynamic
padding (pad_to_sequence_len: false), micro-batch 2, gradient accumulation 2,
max_grad_norm 0.3 (the gradient norm is about 0.45 here, so every step clips),
a cosine schedule, 4 steps, save_steps 2 and the final save (packing in
process, dataset_num_proc 1: a pool of packers would each compile its numba code,
about 10 s apiece on 2 cores).

Oracle: the run without the plugin. Step-1 loss identical; each step's loss
and grad_norm within 1e-4 relative; the saved LoRA weights (checkpoint-2,
checkpoint-4 and the final adapter) within 1e-4 in relative norm; in the
plugin's run the final adapter equals checkpoint-4's bit for bit, and the
checkpoint's optimizer state is the plugin's (its step is 4), so the plugin
did train. Both runs share one prepared dataset (axolotl's cache).
"""
import json
import os
import subprocess
import sys
import types

import pytest
import torch

import trainer_fixture as F
from conftest import BUILD, PLUGIN, ROOT
from test_oracle import STREAMED

TOL = 1e-4
STEPS = 4

YAML = """base_model: {model}
model_type: LlamaForCausalLM
tokenizer_type: PreTrainedTokenizerFast
datasets:
  - path: {data}
    ds_type: json
    type: completion
dataset_prepared_path: {prepared}
val_set_size: 0
output_dir: {out}
sequence_len: 64
sample_packing: true
eval_sample_packing: false
pad_to_sequence_len: false
pad_to_multiple_of: 8
adapter: lora
lora_r: 8
lora_alpha: 16
lora_dropout: 0.0
lora_target_linear: true
lora_mlp_kernel: false
lora_qkv_kernel: false
lora_o_kernel: false
micro_batch_size: 2
gradient_accumulation_steps: 2
max_steps: {steps}
learning_rate: 0.001
optimizer: adamw_torch
lr_scheduler: cosine
warmup_steps: 0
max_grad_norm: 0.3
save_steps: 2
logging_steps: 1
bf16: false
fp16: false
tf32: false
seed: 42
dataset_num_proc: 1
"""


def _env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="", AXOLOTL_DO_NOT_TRACK="1",
               HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled",
               PROTRAIN_PLUGIN_PATH=BUILD)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "host_api", "python")] + env.get("PYTHONPATH", "").split(os.pathsep))
    return env


def _train(yml, log):
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "axolotl.cli.train", yml], cwd=os.path.dirname(yml),
                           env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=600)
    if r.returncode != 0:
        with open(log) as f:
            tail = f.read()[-6000:]
        pytest.fail("axolotl train %s exited %d:\n%s" % (yml, r.returncode, tail))


def _adapter(folder):
    from safetensors.torch import load_file
    return load_file(os.path.join(folder, "adapter_model.safetensors"))


def _history(out):
    with open(os.path.join(out, "checkpoint-%d" % STEPS, "trainer_state.json")) as f:
        return [h for h in json.load(f)["log_history"] if "loss" in h]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not os.path.exists(PLUGIN):
        pytest.fail("the plugin is not built: %s (run make)" % PLUGIN)
    try:
        import axolotl  # noqa: F401
    except ImportError:
        pytest.fail("axolotl is not installed in this environment: make test installs "
                    "host_api/python/requirements-trainers.txt into build/venv")
    root = tmp_path_factory.mktemp("axolotl")
    F.write_model("llama", str(root / "model"))
    F.write_jsonl(str(root / "data.jsonl"), 64)
    ini = root / "protrain.ini"
    ini.write_text("[plugin]\nbackend = host\nlog_level = error\n" + STREAMED)
    outs = {}
    for name, extra in (("plain", ""),
                        ("plugin", "plugins:\n  - protrain.axolotl.ProTrainPlugin\n"
                                   "protrain_config: %s\n" % ini)):
        out = str(root / ("out_" + name))
        yml = root / (name + ".yml")
        yml.write_text(YAML.format(model=root / "model", data=root / "data.jsonl",
                                   prepared=root / "prepared", out=out, steps=STEPS) + extra)
        _train(str(yml), str(root / (name + ".log")))
        outs[name] = out
    return types.SimpleNamespace(root=root, plain=outs["plain"], plugin=outs["plugin"])


def test_axolotl_plugin_equals_plain(runs):
    got, want = _history(runs.plugin), _history(runs.plain)
    assert [h["step"] for h in got] == [h["step"] for h in want] == list(range(1, STEPS + 1))
    assert got[0]["loss"] == want[0]["loss"], (got[0], want[0])
    for a, b in zip(got, want):
        for k in ("loss", "grad_norm"):
            assert abs(a[k] - b[k]) <= TOL * abs(b[k]), (k, a, b)
    # every step clipped (max_grad_norm 0.3 below each step's norm)
    assert all(h["grad_norm"] > 0.3 for h in want)
    for sub in ("checkpoint-2", "checkpoint-%d" % STEPS, ""):
        a, b = _adapter(os.path.join(runs.plugin, sub)), _adapter(os.path.join(runs.plain, sub))
        assert sorted(a) == sorted(b) and len(a) > 0
        err = F.rel_norm(a, b)
        assert err <= TOL, "%s: LoRA weights differ by %g" % (sub or "final", err)
    final, last = _adapter(runs.plugin), _adapter(os.path.join(runs.plugin, "checkpoint-%d" % STEPS))
    assert all(torch.equal(final[k], last[k]) for k in final)
    # the weights moved from the initial adapter (lora_B starts at zero)
    assert max(float(v.abs().max()) for k, v in final.items() if "lora_B" in k) > 0


def test_plugin_trained_the_run(runs):
    """The plugin run's optimizer state is the plugin's (step 4), the plain
    run's is torch's AdamW: the comparison above is between two optimizers."""
    ck = "checkpoint-%d/optimizer.pt" % STEPS
    mine = torch.load(os.path.join(runs.plugin, ck), weights_only=False)
    theirs = torch.load(os.path.join(runs.plain, ck), weights_only=False)
    assert mine["protrain"]["step"] == STEPS and "protrain" not in theirs
    assert len(theirs["state"]) > 0


def test_refusals_before_training(tmp_path):
    """A config the plugin cannot serve stops with a sentence before training."""
    try:
        from protrain.axolotl import ProTrainPlugin
    except ImportError:
        pytest.fail("axolotl is not installed (make test installs requirements-trainers.txt)")
    p = ProTrainPlugin()
    with pytest.raises(ValueError, match="does not exist"):
        p.register({"protrain_config": str(tmp_path / "missing.ini")})
    with pytest.raises(ValueError, match="load_in_4bit"):
        p.register({"load_in_4bit": True})
    args = types.SimpleNamespace(deepspeed=None, fsdp=None, gradient_checkpointing=True,
                                 fp16=False, optim="adamw_torch", world_size=1, weight_decay=0.0)
    m = F.model("llama")
    trainer = types.SimpleNamespace(model=m, args=args, optimizer=None)
    with pytest.raises(ValueError, match="checkpointing"):
        p.post_trainer_create({}, trainer)
    assert trainer.optimizer is None and getattr(m, "_protrain", None) is None
    trainer.optimizer = object()
    with pytest.raises(ValueError, match="already has an optimizer"):
        p.post_trainer_create({}, trainer)
