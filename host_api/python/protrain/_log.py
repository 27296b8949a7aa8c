"""The plugin's log messages as Python logging records on the logger
"protrain". The plugin filters by its INI's [plugin] log_level (default info,
which includes the plan it chose) before calling the host, so the logger
passes everything it is sent unless the application sets its level. When
nothing is configured to show records (no handler on "protrain" or above it),
a stderr handler is added once, so a plain script sees the plan; an
application that configures logging before wrap gets the records through its
own handlers instead."""
import logging
import sys

from . import _abi as A

TRACE = 5
LEVELS = {A.PT_LOG_ERROR: logging.ERROR, A.PT_LOG_WARN: logging.WARNING,
          A.PT_LOG_INFO: logging.INFO, A.PT_LOG_DEBUG: logging.DEBUG, A.PT_LOG_TRACE: TRACE}
logger = logging.getLogger("protrain")


def setup():
    if logger.level == logging.NOTSET:
        logger.setLevel(TRACE)
    if not logger.hasHandlers():
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("protrain %(levelname)s: %(message)s"))
        logger.addHandler(h)


def emit(level, msg):
    """One plugin message (bytes) at the plugin's level."""
    logger.log(LEVELS.get(level, logging.ERROR), "%s", msg.decode(errors="replace"))
