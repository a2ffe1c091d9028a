"""The spare: a child the template forks before a ``run`` asks for one, with its first page copies, the page copies
a generation's first program recorded and its first loader descriptions paid before the request, so that the request
finds it ready; retired when the template's objects change.

A fork of a template that holds torch, transformers and diffusers copies their page tables (tens of
milliseconds), and a child's first hit on an object built ahead copies every page whose reference counts the
provenance walk writes (hundreds of pages). Both are paid before the request: once the template serves, and again
after each ``run`` it hands over (once that program has ended, or a second after it started, so as not to take a
core from it), the template forks a spare. The spare closes the template's descriptors, takes those page copies
(:func:`warm`) and those the generation's first taking program recorded (:mod:`.page_copies`), takes its own random
state (:func:`overmind.runner.child.own_state`) and waits on its end of a
socket pair. A ``run`` request is passed to it with the caller's connection and descriptors, exactly what a child
forked there and then would hold, and it carries on as that child (:func:`overmind.runner.child.run_job`).

A spare is a child forked from the template's state of the moment, so the template retires it (SIGKILL, reaped)
whenever that state changes in a way a child would see: the objects built ahead are rebuilt or dropped, or the
template stops. A template that dies leaves the spare's end of the pair at end-of-file, and the spare exits.
"""
from __future__ import annotations

import os
import signal
import socket


class Spare:
    """The template's handle on its spare: the pid, a pidfd (readable when it exits) and the template's end of the
    pair."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock
        self.pidfd = os.pidfd_open(pid)

    def hand_over(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        """Pass a ``run`` request, its connection and the caller's descriptors; raises OSError if the spare is
        gone."""
        from ..ipc import protocol

        protocol.send_message(self.sock, {"job": request}, [conn.fileno(), *fds])
        self.sock.close()

    def retire(self) -> None:
        """End the spare and reap it."""
        self.sock.close()
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass
        self.reap()

    def reap(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        os.close(self.pidfd)


def pair() -> tuple[socket.socket, socket.socket]:
    """The template's end and the spare's end."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)


def wait_for_job(template, sock: socket.socket) -> tuple[socket.socket, dict, list[int]]:
    """In the spare: leave the template's descriptors, warm up, then wait for a request; returns the connection,
    the request and the caller's descriptors, as a child forked on that request would hold them. Exits when the
    template goes away first."""
    from ..ipc import protocol
    from .child import own_state

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the template's handler would stop a copy of the template
    template.close_in_child(keep=sock)
    warm()
    own_state()
    _copy_pages_ahead(template.pages_path(), sock)
    try:
        message, fds = protocol.recv_message(sock)
    except (OSError, ValueError, protocol.ConnectionClosed):
        os._exit(0)
    sock.close()
    if not fds or "job" not in message:
        os._exit(0)
    return socket.socket(fileno=fds[0]), message["job"], fds[1:]


def warm() -> None:
    """Do ahead what a hit on the objects built ahead does first in a process, where it only reads: check their
    provenance once, as a hit that passes one to another load will (the pages whose reference counts that walk
    writes are copied here, not during the program's first loads), and describe the loaders that built them, as
    their keys will (a loader's first description reads its distribution's records and signature: ~1.5 ms). What
    is found is found again at the hit."""
    try:
        from ..entries import prebuilt
        from ..keys import provenance

        objects = prebuilt.objects()
        for obj in objects:
            if provenance.tracked(obj):
                provenance.origin_of(obj)
        _describe_loaders({type(obj) for obj in objects})
    except Exception:  # a spare that cannot warm up is still a spare
        pass


def _copy_pages_ahead(path: str, sock: socket.socket) -> None:
    """Copy the pages the first program of this generation copied in its loads (page_copies.py), until a request
    arrives on ``sock``: a request never waits for the copying."""
    try:
        import select

        from . import page_copies

        page_copies.copy_ahead(path, stop=lambda: bool(select.select([sock], [], [], 0)[0]))
    except Exception:  # a spare that cannot copy ahead is still a spare
        pass


def _describe_loaders(classes: set) -> None:
    from ..adapters import patching
    from ..keys import key, torch_state

    for cls in classes:
        for fn in patching.routed_classmethods(cls):
            loader = key.describe_loader(fn)
            key.loader_identity(loader)
            key.signature_of(loader)
    torch_state.key_part()
