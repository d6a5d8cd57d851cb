"""pippin's log (pippin/log.h) into Python's logging.

    pippin.log.to_python()            # records go to logging.getLogger("pippin")
    pippin.log.set_level("info")

The library prints nothing but through its log; by default warnings and
errors go to stderr (PIPPIN_LOG sets the level). Install a handler before
starting workers (the C side reads it without a lock); the handler runs on
whatever thread logs.
"""
import atexit
import logging

from . import _lib
from ._lib import lib

LEVELS = {"debug": 0, "info": 1, "warn": 2, "warning": 2, "error": 3, "off": 4}
_TO_LOGGING = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}
_installed = None  # the CFUNCTYPE object C holds


def set_level(level):
    """Messages below level ("debug", "info", "warn", "error", "off") are dropped."""
    lib.pp_log_set_level(LEVELS[level] if isinstance(level, str) else int(level))


def get_level():
    return {v: k for k, v in LEVELS.items() if k != "warning"}[lib.pp_log_get_level()]


def set_handler(fn):
    """fn(level, message) for every message (level: "debug" ... "error");
    None restores the default stderr handler."""
    global _installed
    names = {0: "debug", 1: "info", 2: "warn", 3: "error"}
    if fn is None:
        lib.pp_log_set_handler(_lib.log_handler_fn(), None)
        _installed = None
        return

    def handler(level, msg, user):
        try:
            fn(names.get(level, "error"), msg.decode(errors="replace"))
        except Exception:  # noqa: BLE001 - never into C
            pass

    cb = _lib.log_handler_fn(handler)
    lib.pp_log_set_handler(cb, None)
    _installed = cb


def to_python(logger=None):
    """Routes pippin's messages to a logging.Logger (default "pippin") and
    lets it see the levels that logger enables."""
    logger = logger or logging.getLogger("pippin")
    set_handler(lambda level, msg: logger.log(_TO_LOGGING[LEVELS[level]], msg))
    eff = logger.getEffectiveLevel()
    set_level(0 if eff <= logging.DEBUG else 1 if eff <= logging.INFO else 2 if eff <= logging.WARNING else 3)
    return logger


@atexit.register
def _restore():  # no callback into a finished interpreter
    if _installed is not None:
        lib.pp_log_set_handler(_lib.log_handler_fn(), None)
