"""The server's limits on what one peer may cost it: time to say hello, idle time, frame sizes, buffer total.

Every request is a small JSON control message (bulk data travels as memfds), so the limits can be tight.
The timeouts can be changed through the environment the server starts with (tests shorten them):

>>> Limits.from_env({"OVERMIND_IDLE_TIMEOUT": "30"}).idle_timeout
30.0
"""
from __future__ import annotations

from .._util.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping

ENV_HELLO_TIMEOUT = "OVERMIND_HELLO_TIMEOUT"
ENV_IDLE_TIMEOUT = "OVERMIND_IDLE_TIMEOUT"
ENV_FRAME_TIMEOUT = "OVERMIND_FRAME_TIMEOUT"


class Limits(Frozen):
    """What one connection may take; see the module docstring.

    - ``hello_timeout``: a connection must complete its hello this soon after it connects, or it is closed.
    - ``idle_timeout``: a connection that holds no claim, waits on nothing and sent nothing for this long is
      closed; the client reconnects on its next request.
    - ``frame_timeout``: a frame begun must be complete this soon after its first byte.
    - ``max_request_bytes``: the largest request frame accepted (a publish with its metadata is a few KiB).
    - ``small_frame_bytes``: frames up to this size are read without asking the shared buffer budget.
    - ``max_buffered_bytes``: all frames larger than ``small_frame_bytes`` being received at once, together,
      at most.
    """

    __slots__ = _fields = _compared = ("hello_timeout", "idle_timeout", "frame_timeout", "max_request_bytes",
                                       "small_frame_bytes", "max_buffered_bytes")
    hello_timeout: float
    idle_timeout: float
    frame_timeout: float
    max_request_bytes: int
    small_frame_bytes: int
    max_buffered_bytes: int

    def __init__(self, hello_timeout: float = 10.0, idle_timeout: float = 600.0, frame_timeout: float = 30.0,
                 max_request_bytes: int = 1 << 20, small_frame_bytes: int = 64 << 10,
                 max_buffered_bytes: int = 32 << 20) -> None:
        for name, value in zip(self._fields, (hello_timeout, idle_timeout, frame_timeout, max_request_bytes,
                                              small_frame_bytes, max_buffered_bytes)):
            object.__setattr__(self, name, value)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Limits:
        """Defaults, with the timeouts taken from ``env`` (default ``os.environ``) through overmind.settings
        (seconds, > 0; a bad value warns once there and the default is used)."""
        from .. import settings

        st = settings.current() if env is None else settings.parse(env)[0]
        return cls(hello_timeout=st.hello_timeout, idle_timeout=st.idle_timeout, frame_timeout=st.frame_timeout)
