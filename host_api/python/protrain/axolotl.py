"""protrain.axolotl: an axolotl plugin that trains through protrain.

In the axolotl YAML:

    plugins:
      - protrain.axolotl.ProTrainPlugin
    protrain_config: /path/to/train.ini     # the plugin's INI (omitted: built-in defaults)

Everything else stays axolotl's: learning_rate, adam_beta1/2, adam_epsilon,
weight_decay, max_grad_norm, gradient_accumulation_steps and the lr scheduler
come from the YAML through the TrainingArguments axolotl builds, and
protrain.hf.wrap turns them into the plugin's AdamW. The wrap happens in
post_trainer_create, once the Trainer holds the final (LoRA-wrapped) model:
axolotl never calls a plugin's create_optimizer, so the plugin's optimizer is
set as trainer.optimizer there and the Trainer then builds its scheduler on
it. Settings the plugin cannot serve (protrain.hf.refusals, plus 4/8-bit
loading, whose quantised weights are not floating-point parameters) stop the
run with a sentence before any training.
"""
from typing import Optional

from pydantic import BaseModel

from axolotl.integrations.base import BasePlugin

from . import hf


class ProTrainArgs(BaseModel):
    """The YAML keys this plugin adds to axolotl's config schema."""

    protrain_config: Optional[str] = None
    protrain_plugin: str = "protrain"
    protrain_uniform_weight_decay: bool = False


def _cfg_refusals(cfg):
    out = []
    if cfg.get("load_in_4bit") or cfg.get("load_in_8bit"):
        out.append("load_in_4bit/load_in_8bit: quantised weights are not floating-point "
                   "parameters the plugin can own; train LoRA on fp32/bf16 weights")
    path = cfg.get("protrain_config")
    if path is not None:
        import os
        if not os.path.isfile(path):
            out.append("protrain_config: %s does not exist" % path)
    return out


class ProTrainPlugin(BasePlugin):
    """Hands the Trainer's model to the plugin (protrain.hf.wrap) after the
    Trainer is built, and makes the plugin's optimizer the Trainer's."""

    def get_input_args(self):
        return "protrain.axolotl.ProTrainArgs"

    def register(self, cfg):
        bad = _cfg_refusals(cfg)
        if bad:
            raise ValueError("protrain.axolotl: " + "; ".join(bad))

    def post_trainer_create(self, cfg, trainer):
        bad = _cfg_refusals(cfg)
        if bad:
            raise ValueError("protrain.axolotl: " + "; ".join(bad))
        hf.attach(trainer, config=cfg.get("protrain_config"),
                  plugin=cfg.get("protrain_plugin") or "protrain",
                  uniform_weight_decay=bool(cfg.get("protrain_uniform_weight_decay")))
