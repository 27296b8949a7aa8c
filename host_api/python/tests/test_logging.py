"""The plugin's log messages reach Python logging (logger "protrain") at the
INI's log_level: info shows the plan. The control: at log_level = warn no
info record arrives, the plan among them."""
import logging

import oracle
import protrain.torch as ptt


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=1)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def _records(tmp_path, plugin_path, level):
    ini = tmp_path / ("%s.ini" % level)
    ini.write_text("[plugin]\nbackend = host\nlog_level = %s\n" % level)
    h = Records()
    logger = logging.getLogger("protrain")
    logger.addHandler(h)
    try:
        m, opt = ptt.wrap(oracle.make_model("gpt2"), config=str(ini), plugin=plugin_path)
        x = oracle.batches(1)[0]
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
    finally:
        logger.removeHandler(h)
    return h.records


def test_info_shows_the_plan(tmp_path, plugin_path):
    recs = _records(tmp_path, plugin_path, "info")
    plan = [r for r in recs if r.getMessage().startswith("plan (profiled")]
    assert plan and plan[0].levelno == logging.INFO and plan[0].name == "protrain"


def test_control_warn_hides_info(tmp_path, plugin_path):
    recs = _records(tmp_path, plugin_path, "warn")
    assert not [r for r in recs if r.levelno < logging.WARNING]
    assert not [r for r in recs if r.getMessage().startswith("plan (profiled")]
