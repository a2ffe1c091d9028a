"""The client's time limits: every wait of a client on the server is bounded (values from :mod:`overmind.settings`).

* ``OVERMIND_REPLY_TIMEOUT`` (default 10 s): connect, hello and every control request (publish, release,
  status, ...). A server that does not answer within it is stopped (``kill -STOP``, Ctrl-Z on
  ``overmind serve``, a debugger) or wedged; the load steps aside.
* ``OVERMIND_CONTROL_TIMEOUT`` (default 2 s): the same for the ``overmind`` command (``status``, ``ls``,
  ``evict``, ``stop``, ``doctor``): a server that does not answer these small requests within it is not going
  to, and the command says so at once. A program's ``cache_info()``/``evict()`` waits the reply timeout.
* ``OVERMIND_WAIT_TIMEOUT`` (default 900 s): how long a load waits on another process's claim; the client
  gives the server that long plus one reply timeout to answer.
* ``OVERMIND_SERVER_START_TIMEOUT`` (default 15 s): how long the launcher waits for a new server.

A value that is not a positive number gets one warning naming the variable (:mod:`overmind.settings`) and the
default is used; ``overmind doctor`` lists it too.
"""
from __future__ import annotations

from .. import settings

ENV_REPLY = "OVERMIND_REPLY_TIMEOUT"
ENV_WAIT = "OVERMIND_WAIT_TIMEOUT"
ENV_CONTROL = "OVERMIND_CONTROL_TIMEOUT"
ENV_START = "OVERMIND_SERVER_START_TIMEOUT"
_ATTR = {ENV_REPLY: "reply_timeout", ENV_WAIT: "wait_timeout", ENV_START: "server_start_timeout",
         ENV_CONTROL: "control_timeout"}
DEFAULTS = {name: next(s.default for s in settings.DECLARED if s.name == name) for name in _ATTR}


def reply_timeout() -> float:
    return settings.current().reply_timeout


def control_timeout() -> float:
    return settings.current().control_timeout


def wait_timeout() -> float:
    return settings.current().wait_timeout


def start_timeout() -> float:
    return settings.current().server_start_timeout
