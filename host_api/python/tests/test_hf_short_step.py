"""Accumulation steps the Trainer makes that differ from gradient_accumulation_steps
passes of one shape, on a wrapped model (protrain.hf.wrap, no plan_shape) against the
plain Trainer:

- an epoch of 5 batches under gradient_accumulation_steps 2 ends with a step of one
  micro-batch (steps of 2, 2, 1 passes, two epochs);
- a longer micro-batch second in its step (batches 2x8 then 2x31, then 2x13 then
  2x41): the plan must hold the step's longest before its first micro-batch.

The Trainer fetches each step's micro-batches up front (get_batch_samples); protrain.hf
hooks that method and declares the step (protrain.torch.declare_step). The controls
take the hook away: the first run is then refused at the short step's
optimizer.step(), the second at the longer micro-batch.

Oracle (as test_hf_trainer.py): the step-1 micro-batch losses are bit-identical,
every loss, the logged grad norms and the weights within 1e-5 relative (the
remaining difference is the optimizer's rounding order; measured below 1e-7).
"""
import os
import random
import types

import pytest
import torch

import protrain.hf
import protrain.torch as ptt
import trainer_fixture as F
from conftest import PLUGIN
from test_oracle import STREAMED

BATCH, ACCUM = 2, 2
TOL = 1e-5


def _rows(tok, n_words, seed):
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(F.WORDS) for _ in range(n)) for n in n_words]
    return [{"input_ids": tok(t)["input_ids"]} for t in texts]


def _args(out, **kw):
    from transformers import TrainingArguments
    base = dict(output_dir=out, per_device_train_batch_size=BATCH,
                gradient_accumulation_steps=ACCUM, learning_rate=1e-3, logging_steps=1,
                save_strategy="no", eval_strategy="no", report_to=[], seed=0, use_cpu=True,
                disable_tqdm=True, dataloader_num_workers=0)
    base.update(kw)
    return TrainingArguments(**base)


def _trainer(model, args, tok, rows, optimizers=(None, None), pad_to=None):
    from transformers import DataCollatorForLanguageModeling, Trainer
    collate = DataCollatorForLanguageModeling(tok, mlm=False, pad_to_multiple_of=pad_to)
    shapes = []

    def collator(batch):
        out = collate(batch)
        shapes.append(tuple(out["input_ids"].shape))
        return out
    tr = F.recording(Trainer)(model=model, args=args, train_dataset=rows, data_collator=collator,
                              optimizers=optimizers)
    tr.shapes = shapes
    return tr


def _logged(tr, key):
    return [float(h[key]) for h in tr.state.log_history if key in h]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if not os.path.exists(PLUGIN):
        pytest.fail("the plugin is not built: %s (run make)" % PLUGIN)
    root = tmp_path_factory.mktemp("hf_short_step")
    ini = root / "t.ini"
    ini.write_text("[plugin]\nbackend = host\nlog_level = error\n" + STREAMED)
    return types.SimpleNamespace(root=root, ini=str(ini), tok=F.tokenizer())


# (rows, TrainingArguments overrides, collator pad_to) of each case
def _short_case(tok):
    # 10 rows of 2 = 5 batches per epoch: steps of 2, 2 and 1 micro-batches;
    # one padded length, so only the count differs
    return _rows(tok, [5 + 3 * i for i in range(10)], 11), dict(num_train_epochs=2), 48


def _longer_case(tok):
    # sequential order: step 1 is 2x8 then 2x31, step 2 is 2x13 then 2x41
    words = [5, 7, 30, 20, 10, 12, 40, 35]
    return _rows(tok, words, 12), dict(num_train_epochs=1, train_sampling_strategy="sequential"), \
        None


def _run(env, name, case, how):
    """how: None (the plain Trainer), "wrap" (protrain.hf.wrap, then the
    Trainer) or "attach" (the Trainer, then protrain.hf.attach)."""
    rows, kw, pad_to = case(env.tok)
    m = F.model("qwen2")
    args = _args(str(env.root / name), **kw)
    optimizers = (None, None)
    if how == "wrap":
        m, optimizers = protrain.hf.wrap(m, args, config=env.ini, plugin=PLUGIN)
    tr = _trainer(m, args, env.tok, rows, optimizers, pad_to)
    if how == "attach":
        protrain.hf.attach(tr, config=env.ini, plugin=PLUGIN)
    tr.train()
    return tr


def _same(got, ref, init):
    assert len(got.losses) == len(ref.losses)
    for i in range(ACCUM):
        assert got.losses[i] == ref.losses[i], (i, got.losses[:ACCUM], ref.losses[:ACCUM])
    for i, (a, b) in enumerate(zip(got.losses, ref.losses)):
        assert abs(a - b) <= TOL * abs(b), "micro-batch %d: %r vs %r" % (i, a, b)
    err = F.rel_norm(ptt.state_dict(got.model), ref.model.state_dict())
    assert err <= TOL, "weights differ by %g in relative norm" % err
    assert F.rel_norm(ref.model.state_dict(), init) > 1e-3       # the weights moved
    gn_got, gn_ref = _logged(got, "grad_norm"), _logged(ref, "grad_norm")
    assert len(gn_got) == len(gn_ref) == got.state.global_step
    for a, b in zip(gn_got, gn_ref):
        assert abs(a - b) <= TOL * abs(b), (gn_got, gn_ref)


def test_short_last_accumulation_step(env):
    ref = _run(env, "short_plain", _short_case, None)
    got = _run(env, "short_wrapped", _short_case, "wrap")
    init = F.model("qwen2").state_dict()
    # 2 epochs of steps of 2, 2, 1 micro-batches, all trained
    assert got.state.global_step == ref.state.global_step == 6
    assert len(got.losses) == 10
    assert set(got.shapes) == {(BATCH, 48)}
    _same(got, ref, init)


def test_longer_micro_batch_second_in_step(env):
    _longer(env, "wrap")


def _longer(env, how):
    ref = _run(env, "longer_plain_" + how, _longer_case, None)
    got = _run(env, "longer_" + how, _longer_case, how)
    init = F.model("qwen2").state_dict()
    assert got.shapes == [(2, 8), (2, 31), (2, 13), (2, 41)]
    assert got.state.global_step == 2 and len(got.losses) == 4
    ad = got.model._protrain
    # the first forward planned for 2x31, step 2's first for 2x41 (one replan)
    assert ad.shape == (2, 41) and ad.replans == 1
    _same(got, ref, init)


@pytest.fixture
def unhooked(monkeypatch):
    """The controls: Trainer.get_batch_samples as transformers defines it, and
    neither wrap nor attach hooking it."""
    from transformers import Trainer
    f = Trainer.__dict__["get_batch_samples"]
    monkeypatch.setattr(Trainer, "get_batch_samples", getattr(f, "__wrapped__", f))
    monkeypatch.setattr(protrain.hf, "_hook_trainer_class", lambda: None)


def test_control_short_step_refused_without_hook(env, unhooked):
    # the Trainer clips (max_grad_norm 1.0) before optimizer.step(): refused there
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_ after 1 of the step's 2 "
                                           r"forward/backward passes.*declare_step"):
        _run(env, "short_control", _short_case, "wrap")


def test_control_longer_micro_batch_refused_without_hook(env, unhooked):
    with pytest.raises(RuntimeError, match=r"batch 2 x sequence 31, larger than the batch 2 x "
                                           r"sequence 8.*plan_shape"):
        _run(env, "longer_control", _longer_case, "wrap")


def test_attach_hooks_the_trainer_instance(env, unhooked):
    """attach hooks the Trainer instance's get_batch_samples itself (a
    subclass may override the method): the class is unhooked here."""
    _longer(env, "attach")


def test_own_loop_declare_step(env):
    """Without a Trainer: the refusals name what to do, and a declared step of
    another count or with a longer second micro-batch trains."""
    m = F.model("qwen2")
    m, opt = ptt.wrap(m, config=env.ini, plugin=PLUGIN, lr=1e-3, grad_accum=2)
    ids = torch.randint(4, F.VOCAB, (2, 12))

    def step(*lengths):
        for t in lengths:
            x = ids[:, :t]
            m(input_ids=x, labels=x).loss.backward()
        opt.step()
    step(12, 12)
    with pytest.raises(RuntimeError, match=r"declare_step\(model, 1\)"):
        step(12)
    m(input_ids=ids, labels=ids).loss.backward()      # the step's second pass: it completes
    opt.step()
    ptt.declare_step(m, 1)
    step(12)                                          # a declared short step
    with pytest.raises(RuntimeError, match="declare_step inside a step"):
        m(input_ids=ids, labels=ids).loss.backward()
        ptt.declare_step(m, 1)
    m(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    ad = m._protrain
    ad.world = 2        # as under 2 ranks: a short step would desynchronise the all-reduces
    with pytest.raises(ValueError, match="every rank runs grad_accum = 2"):
        ptt.declare_step(m, 1)
    ptt.declare_step(m, 2, [(2, 12)])               # the full count only declares shapes
    ad.world, ad.declared = 1, None
    for bad in (0, 3):
        with pytest.raises(ValueError, match=r"n_micro must be in \[1, grad_accum = 2\]"):
            ptt.declare_step(m, bad)
    assert m._protrain.shape == (2, 12)
    ptt.declare_step(m, 2, [(2, 6), (2, 24)])
    longer = torch.randint(4, F.VOCAB, (2, 24))
    m(input_ids=ids[:, :6], labels=ids[:, :6]).loss.backward()
    m(input_ids=longer, labels=longer).loss.backward()
    opt.step()
    assert m._protrain.shape == (2, 24)
    bigger = torch.randint(4, F.VOCAB, (2, 30))
    with pytest.raises(RuntimeError, match="plan_shape"):    # undeclared: refused with advice
        m(input_ids=ids, labels=ids).loss.backward()
        m(input_ids=bigger, labels=bigger).loss.backward()
