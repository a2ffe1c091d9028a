"""Whether the code a template imported is still the code on disk (inotify on the imported modules' folders).

The template imported ``overmind``, torch and the preload list once; a program must never run an older copy
of a module than the one on disk. Distributions that are installed, upgraded or removed change the template's
key (their ``*.dist-info``); this catches the rest: a preloaded module edited in place (an editable install of
diffusers, or of overmind itself, in a development tree). The template watches the folder of every module it
imported (one inotify instance, no thread: its descriptor sits in the template's selector) and stops serving
the moment one of those files is written, replaced or removed; the next ``overmind run`` starts a fresh
template.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_CLOSE_WRITE, IN_Q_OVERFLOW = 0x100, 0x200, 0x8, 0x4000
IN_NONBLOCK, IN_CLOEXEC, IN_ONLYDIR = os.O_NONBLOCK, os.O_CLOEXEC, 0x01000000
_MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


class SourceWatch:
    """``SourceWatch()`` watches the files of every module imported so far; ``changed()`` names one that
    changed since (or None). ``fileno()`` is readable when something in a watched folder happened."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd = fd
        self.files: set[bytes] = set()
        self._folders: dict[int, bytes] = {}
        self._watched: set[bytes] = set()
        self._seen: set[str] = set()  # module names whose files are watched
        self.stale: str | None = None
        self.watch_imported()

    def watch_imported(self) -> None:
        """Watch the files of the modules imported since the last call too (objects built ahead import some)."""
        folders = set()
        for name, module in list(sys.modules.items()):
            if name in self._seen:
                continue
            self._seen.add(name)
            path = getattr(module, "__file__", None)
            if isinstance(path, str) and os.path.isabs(path):
                real = os.fsencode(os.path.realpath(path))
                self.files.add(real)
                folders.add(os.path.dirname(real))
        for folder in sorted(folders - self._watched):
            wd = self._add(self.fd, folder, _MASK | IN_ONLYDIR)
            if wd >= 0:
                self._folders[wd] = folder
                self._watched.add(folder)

    def fileno(self) -> int:
        return self.fd

    def changed(self) -> str | None:
        """Read what happened; the first imported file that was written, replaced or removed, or None."""
        while self.stale is None:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    self.stale = "too many changes at once in the imported modules' folders"
                    break
                path = os.path.join(self._folders.get(wd, b""), name)
                if path in self.files:
                    self.stale = os.fsdecode(path)
                    break
        return self.stale

    def close(self) -> None:
        os.close(self.fd)
