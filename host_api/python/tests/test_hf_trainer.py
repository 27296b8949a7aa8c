"""The Hugging Face Trainer, unchanged, on a wrapped model (protrain.hf.wrap)
against the same Trainer with its own AdamW: Qwen2 (a family the other tests
do not use), the Trainer's defaults (max_grad_norm 1.0, adamw_torch_fused,
linear schedule), texts of varying length padded per batch by
DataCollatorForLanguageModeling (the plan made for the longest batch,
plan_shape), gradient_accumulation_steps 2, evaluation, save_steps 2 with
save_total_limit 1, 4 optimizer steps.

Oracle: the step-1 micro-batch losses are bit-identical (nothing has been
updated yet), every later loss is within 1e-4 relative, the weights within
1e-4 in relative norm, the logged grad_norm within 1e-4 (the Trainer's
clip_grad_norm_ reaches the plugin), the evaluation losses within 1e-4. The
remaining difference is the optimizer's rounding (fp32 in the plugin, torch's
fused AdamW in its own order; test_oracle.py measures 1e-6 over 10 steps).
"""
import copy
import os
import shutil
import types

import pytest
import torch

import protrain.hf
import protrain.torch as ptt
import trainer_fixture as F
from conftest import PLUGIN
from test_oracle import STREAMED

N_TRAIN, N_EVAL, BATCH, ACCUM, STEPS = 16, 4, 2, 2, 4
TOL = 1e-4


def _args(out, **kw):
    from transformers import TrainingArguments
    base = dict(output_dir=out, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
                gradient_accumulation_steps=ACCUM, max_steps=STEPS, learning_rate=1e-3,
                logging_steps=1, save_steps=2, save_total_limit=1, eval_strategy="steps",
                eval_steps=2, report_to=[], seed=0, use_cpu=True, disable_tqdm=True,
                dataloader_num_workers=0)
    base.update(kw)
    return TrainingArguments(**base)


def _data(tok):
    """Token ids of texts of 5..40 words plus a column the model does not take
    ("text"), which remove_unused_columns must drop while keeping input_ids."""
    def rows(n, seed):
        return [{"input_ids": tok(t)["input_ids"], "text": t} for t in F.texts(n, seed)]
    return rows(N_TRAIN, 7), rows(N_EVAL, 8)


def _trainer(model, args, tok, optimizers=(None, None), pad_to=None):
    """A recording Trainer; .shapes collects the shape of every collated batch."""
    from transformers import DataCollatorForLanguageModeling, Trainer
    collate = DataCollatorForLanguageModeling(tok, mlm=False, pad_to_multiple_of=pad_to)
    shapes = []

    def collator(rows):
        out = collate(rows)
        shapes.append(tuple(out["input_ids"].shape))
        return out
    train, ev = _data(tok)
    tr = F.recording(Trainer)(model=model, args=args, train_dataset=train, eval_dataset=ev,
                              data_collator=collator, optimizers=optimizers)
    tr.shapes = shapes
    return tr


def _logged(tr, key):
    return [h[key] for h in tr.state.log_history if key in h]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A folder, the plugin's INI (streamed chunks) and the tokenizer."""
    if not os.path.exists(PLUGIN):
        pytest.fail("the plugin is not built: %s (run make)" % PLUGIN)
    root = tmp_path_factory.mktemp("hf_trainer")
    ini = root / "t.ini"
    ini.write_text("[plugin]\nbackend = host\nlog_level = error\n" + STREAMED)
    tok = F.tokenizer()
    # plan for the longest training batch: with per-batch padding a longer
    # micro-batch may come second in an accumulation step
    shape = (BATCH, max(len(r["input_ids"]) for r in _data(tok)[0]))
    return types.SimpleNamespace(root=root, ini=str(ini), tok=tok, plugin=PLUGIN, shape=shape)


@pytest.fixture(scope="module")
def runs(env):
    """The plain Trainer and the wrapped one, each trained once for the tests below."""
    m0 = F.model("qwen2")
    init = copy.deepcopy(m0.state_dict())
    ref = _trainer(m0, _args(str(env.root / "plain")), env.tok)
    ref.train()
    m1 = F.model("qwen2")
    m1.load_state_dict(init)
    args = _args(str(env.root / "wrapped"))
    m1, optimizers = protrain.hf.wrap(m1, args, config=env.ini, plugin=env.plugin,
                                      plan_shape=env.shape)
    got = _trainer(m1, args, env.tok, optimizers)
    got.train()
    return types.SimpleNamespace(root=env.root, ini=env.ini, tok=env.tok, init=init, ref=ref,
                                 got=got, model=m1, args=args, plugin=env.plugin, shape=env.shape)


def test_trainer_equals_plain_trainer(runs):
    ref, got = runs.ref, runs.got
    assert len(got.losses) == len(ref.losses) == STEPS * ACCUM
    assert got.losses[0] == ref.losses[0], "step-1 loss %r != %r" % (got.losses[0], ref.losses[0])
    for i, (a, b) in enumerate(zip(got.losses, ref.losses)):
        assert abs(a - b) <= TOL * abs(b), "micro-batch %d: %r vs %r" % (i, a, b)
    err = F.rel_norm(ptt.state_dict(runs.model), ref.model.state_dict())
    assert err <= TOL, "weights differ by %g in relative norm" % err
    # the weights moved: the comparison is not between two untouched models
    assert F.rel_norm(ref.model.state_dict(), runs.init) > 1e-3
    gn_got, gn_ref = _logged(got, "grad_norm"), _logged(ref, "grad_norm")
    assert len(gn_got) == len(gn_ref) == STEPS
    for a, b in zip(gn_got, gn_ref):
        assert abs(float(a) - float(b)) <= TOL * abs(float(b)), (gn_got, gn_ref)
    ev_got, ev_ref = _logged(got, "eval_loss"), _logged(ref, "eval_loss")
    assert len(ev_got) == len(ev_ref) == STEPS // 2
    for a, b in zip(ev_got, ev_ref):
        assert abs(a - b) <= TOL * abs(b), (ev_got, ev_ref)
    # batches of several lengths went through (dynamic padding), the longest
    # the one planned for
    assert got.state.global_step == STEPS
    assert len(set(got.shapes)) >= 5 and max(got.shapes) == runs.shape, sorted(set(got.shapes))


def test_checkpoints_and_save_model(runs):
    """save_total_limit 1 keeps the last checkpoint only; save_model then
    from_pretrained gives exactly protrain.torch.state_dict's weights."""
    from transformers import Qwen2ForCausalLM
    out = runs.args.output_dir
    assert sorted(d for d in os.listdir(out) if d.startswith("checkpoint-")) == \
        ["checkpoint-%d" % STEPS]
    save = str(runs.root / "saved")
    runs.got.save_model(save)
    back = Qwen2ForCausalLM.from_pretrained(save).state_dict()
    want = ptt.state_dict(runs.model)
    assert set(back) <= set(want)
    for k, v in back.items():
        assert torch.equal(v, want[k]), k
    # the checkpoint's weights are the final ones too
    ck = Qwen2ForCausalLM.from_pretrained(os.path.join(out, "checkpoint-%d" % STEPS)).state_dict()
    assert all(torch.equal(v, want[k]) for k, v in ck.items())


def test_resume_from_copied_checkpoint(runs, tmp_path):
    """A run saved at step 2 (its checkpoint folder copied elsewhere, the
    original deleted) and resumed there with resume_from_checkpoint ends
    where the uninterrupted run ended."""
    half = tmp_path / "half"
    m = F.model("qwen2")
    m.load_state_dict(runs.init)
    args = _args(str(half), max_steps=STEPS, save_steps=2, save_total_limit=None)
    m, optimizers = protrain.hf.wrap(m, args, config=runs.ini, plugin=runs.plugin,
                                     plan_shape=runs.shape)
    tr = _trainer(m, args, runs.tok, optimizers)
    # stop after step 2's save: a callback ends training there
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if state.global_step == 2:
                control.should_training_stop = True
            return control
    tr.add_callback(Stop())
    tr.train()
    moved = tmp_path / "moved" / "checkpoint-2"
    shutil.copytree(half / "checkpoint-2", moved)
    shutil.rmtree(half)
    m2 = F.model("qwen2", seed=123)        # other initial weights: the checkpoint must load
    args2 = _args(str(tmp_path / "resumed"))
    m2, optimizers2 = protrain.hf.wrap(m2, args2, config=runs.ini, plugin=runs.plugin,
                                       plan_shape=runs.shape)
    tr2 = _trainer(m2, args2, runs.tok, optimizers2)
    tr2.train(resume_from_checkpoint=str(moved))
    assert tr2.state.global_step == STEPS
    err = F.rel_norm(ptt.state_dict(m2), ptt.state_dict(runs.model))
    assert err == 0.0, "resumed weights differ from the uninterrupted run's by %g" % err
    assert tr2.losses == runs.got.losses[2 * ACCUM:]


def test_hidden_signature_drops_input_ids(env):
    """Control for the forward's signature: without __wrapped__ the wrapped
    forward reads as (*args, **kwargs), remove_unused_columns keeps no
    input_ids and the first batch has none."""
    m = F.model("qwen2")
    args = _args(str(env.root / "hidden"))
    m, optimizers = protrain.hf.wrap(m, args, config=env.ini, plugin=env.plugin)
    import inspect
    assert "input_ids" in inspect.signature(m.forward).parameters
    del m.forward.__wrapped__
    assert "input_ids" not in inspect.signature(m.forward).parameters
    tr = _trainer(m, args, env.tok, optimizers)
    # the collator gets rows without input_ids (only labels-like columns survive)
    with pytest.raises(ValueError, match="input_ids"):
        tr.train()


def test_wrong_grad_accum_refused(env):
    """protrain.torch.wrap(grad_accum=1) under a Trainer accumulating 2: the
    second forward of the step is refused with a sentence naming grad_accum
    (batches of one length here, so nothing but the count is wrong)."""
    m = F.model("qwen2")
    args = _args(str(env.root / "accum"))
    m, opt = ptt.wrap(m, config=env.ini, plugin=env.plugin, lr=1e-3, max_grad_norm=1.0,
                      grad_accum=1)
    tr = _trainer(m, args, env.tok, (opt, None), pad_to=48)
    with pytest.raises(RuntimeError, match="grad_accum = 1"):
        tr.train()


def test_refusals():
    """What cannot work in the same Trainer is refused with a sentence each."""
    ok = dict(deepspeed=None, fsdp=None, gradient_checkpointing=False, fp16=False,
              optim="adamw_torch", world_size=1, weight_decay=0.0)
    assert protrain.hf.refusals(types.SimpleNamespace(**ok)) == []
    for key, val, word in (("deepspeed", "ds.json", "DeepSpeed"), ("fsdp", "full_shard", "FSDP"),
                           ("gradient_checkpointing", True, "CKPT"), ("fp16", True, "GradScaler"),
                           ("optim", "adafactor", "AdamW"), ("world_size", 2, "rank 0 only"),
                           ("weight_decay", 0.1, "uniform_weight_decay")):
        bad = protrain.hf.refusals(types.SimpleNamespace(**dict(ok, **{key: val})))
        assert len(bad) == 1 and word in bad[0], (key, bad)
    assert protrain.hf.refusals(types.SimpleNamespace(**dict(ok, weight_decay=0.1)),
                                uniform_weight_decay=True) == []
    m = F.model("qwen2")
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        protrain.hf.wrap(m, types.SimpleNamespace(**dict(ok, gradient_checkpointing=True)))
    assert getattr(m, "_protrain", None) is None       # nothing was wrapped
