"""The client's time limits, read from the environment: every wait of a client on the server is bounded.

* ``OVERMIND_REPLY_TIMEOUT`` (default 10 s): connect, hello and every control request (publish, release,
  status, ...). A server that does not answer within it is stopped (``kill -STOP``, Ctrl-Z on
  ``overmind serve``, a debugger) or wedged; the load steps aside.
* ``OVERMIND_WAIT_TIMEOUT`` (default 900 s): how long a load waits on another process's claim; the client
  gives the server that long plus one reply timeout to answer.
* ``OVERMIND_SERVER_START_TIMEOUT`` (default 15 s): how long the launcher waits for a new server.

A value that is not a positive number raises :class:`SettingError` (an ``OvermindError``, so a load falls
back with one warning naming the variable); ``overmind doctor`` reports it too.
"""
from __future__ import annotations

import math
import os

from .errors import OvermindError

ENV_REPLY = "OVERMIND_REPLY_TIMEOUT"
ENV_WAIT = "OVERMIND_WAIT_TIMEOUT"
ENV_START = "OVERMIND_SERVER_START_TIMEOUT"
DEFAULTS = {ENV_REPLY: 10.0, ENV_WAIT: 900.0, ENV_START: 15.0}


class SettingError(OvermindError, ValueError):
    """An Overmind environment variable holds a value Overmind cannot use."""


def seconds(name: str) -> float:
    """The positive number of seconds in ``$name``, or its default when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise SettingError(f"overmind: {name}={raw!r} is not a positive number of seconds; set it to one "
                           f"(e.g. {name}={DEFAULTS[name]:g}) or unset it for the default.")
    return value


def reply_timeout() -> float:
    return seconds(ENV_REPLY)


def wait_timeout() -> float:
    return seconds(ENV_WAIT)


def start_timeout() -> float:
    return seconds(ENV_START)
