"""TRL's SFTTrainer on the plugin, against the same SFTTrainer with its own
AdamW (Qwen2, texts of varying length padded per batch by TRL's collator:
batches 2x35, 2x19, 2x42, so the plan grows between steps; fp32, 3 steps at
lr 1e-3, max_grad_norm 1.0).

- attach: the SFTTrainer built with its default loss (loss_type='chunked_nll',
  which replaces model.forward at construction), then protrain.hf.attach:
  step-1 loss bit-identical, losses and weights within 1e-4 relative.
- wrap first: protrain.hf.wrap(model, SFTConfig(loss_type='nll')) and
  SFTTrainer(optimizers=...): the same model trains to the same weights
  within 1e-4 (nll and chunked_nll are the same loss, computed in another order).
- control: protrain.hf.wrap with loss_type='chunked_nll' is refused with a
  sentence (the SFTTrainer would replace the plugin's forward).
"""
import copy
import os

import pytest

import protrain.hf
import protrain.torch as ptt
import trainer_fixture as F
from conftest import PLUGIN
from test_oracle import RESIDENT

TOL = 1e-4
STEPS = 3


def _config(out, **kw):
    from trl import SFTConfig
    base = dict(output_dir=out, max_length=64, per_device_train_batch_size=2, max_steps=STEPS,
                learning_rate=1e-3, logging_steps=1, gradient_checkpointing=False, bf16=False,
                report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True,
                dataloader_num_workers=0)
    base.update(kw)
    return SFTConfig(**base)


def _sft(model, args, tok, optimizers=(None, None)):
    from datasets import Dataset
    from trl import SFTTrainer
    ds = Dataset.from_dict({"text": F.texts(12, seed=11)})
    tr = F.recording(SFTTrainer)(model=model, args=args, train_dataset=ds,
                                 processing_class=tok, optimizers=optimizers)
    collate, tr.shapes = tr.data_collator, []

    def collator(rows):          # TRL's own collator, the batch shapes recorded
        out = collate(rows)
        tr.shapes.append(tuple(out["input_ids"].shape))
        return out
    tr.data_collator = collator
    return tr


def test_sft_trainer(tmp_path):
    if not os.path.exists(PLUGIN):
        pytest.fail("the plugin is not built: %s (run make)" % PLUGIN)
    ini = tmp_path / "t.ini"
    ini.write_text("[plugin]\nbackend = host\nlog_level = error\n" + RESIDENT)
    tok = F.tokenizer()
    m0 = F.model("qwen2")
    init = copy.deepcopy(m0.state_dict())

    ref = _sft(m0, _config(str(tmp_path / "plain")), tok)
    assert ref.args.loss_type == "chunked_nll"
    ref.train()

    m1 = F.model("qwen2")
    m1.load_state_dict(init)
    got = _sft(m1, _config(str(tmp_path / "attach")), tok)
    protrain.hf.attach(got, config=str(ini), plugin=PLUGIN)
    got.train()
    assert len(got.losses) == len(ref.losses) == STEPS
    # each step's batch has its own length, and a later one is longer than the
    # first (the plugin planned again between steps); the loader may fetch one more
    seen = got.shapes[:STEPS]
    assert len(set(seen)) == STEPS and seen == ref.shapes[:STEPS], got.shapes
    assert max(seen) > seen[0], seen
    assert got.losses[0] == ref.losses[0], (got.losses, ref.losses)
    for a, b in zip(got.losses, ref.losses):
        assert abs(a - b) <= TOL * abs(b), (got.losses, ref.losses)
    want = ref.model.state_dict()
    err = F.rel_norm(ptt.state_dict(got.model), want)
    assert err <= TOL, "attach: weights differ by %g" % err
    assert F.rel_norm(want, init) > 1e-3          # they moved

    m2 = F.model("qwen2")
    m2.load_state_dict(init)
    args = _config(str(tmp_path / "wrap"), loss_type="nll")
    m2, optimizers = protrain.hf.wrap(m2, args, config=str(ini), plugin=PLUGIN)
    first = _sft(m2, args, tok, optimizers)
    first.train()
    for a, b in zip(first.losses, ref.losses):
        assert abs(a - b) <= TOL * abs(b), (first.losses, ref.losses)
    err = F.rel_norm(ptt.state_dict(m2), want)
    assert err <= TOL, "wrap first: weights differ by %g" % err


def test_chunked_nll_wrap_refused(tmp_path):
    m = F.model("qwen2")
    with pytest.raises(ValueError, match="protrain.hf.attach"):
        protrain.hf.wrap(m, _config(str(tmp_path / "x")))
    assert getattr(m, "_protrain", None) is None
