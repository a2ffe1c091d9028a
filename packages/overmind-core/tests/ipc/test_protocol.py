"""Framing over real Unix socket pairs: JSON frames, fd batching past 250, short reads, disconnects."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import threading
import time

import pytest

from overmind.ipc.protocol import (
    MAX_FDS_PER_FRAME,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    ConnectionClosed,
    FrameError,
    close_fds,
    recv_message,
    send_message,
)


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_protocol_version_is_6():
    assert PROTOCOL_VERSION == 6  # 6: the adopt op (entries imported from the fleet)


def test_roundtrip_without_fds(pair):
    a, b = pair
    send_message(a, {"op": "status", "text": "naïve ✓", "n": [1, 2.5, None]})
    obj, fds = recv_message(b)
    assert obj == {"op": "status", "text": "naïve ✓", "n": [1, 2.5, None]}
    assert fds == []


def test_back_to_back_messages_keep_their_own_fds(pair, tmp_path):
    a, b = pair
    files = [open(tmp_path / f"f{i}", "w") for i in range(3)]
    try:
        send_message(a, {"i": 0}, [files[0].fileno()])
        send_message(a, {"i": 1})
        send_message(a, {"i": 2}, [files[1].fileno(), files[2].fileno()])
        got = [recv_message(b) for _ in range(3)]
        assert [o["i"] for o, _ in got] == [0, 1, 2]
        assert [len(f) for _, f in got] == [1, 0, 2]
        inodes = [os.fstat(fd).st_ino for _, fds in got for fd in fds]
        assert inodes == [os.fstat(f.fileno()).st_ino for f in files]
        for _, fds in got:
            close_fds(fds)
    finally:
        for f in files:
            f.close()


def test_more_than_250_fds_are_batched_and_arrive_in_order(pair):
    a, b = pair
    count = 2 * MAX_FDS_PER_FRAME + 37
    memfds = [os.memfd_create(f"m{i}") for i in range(count)]
    try:
        # Send from a thread: the follow-up frames may not fit the socket buffer before the reader starts.
        t = threading.Thread(target=send_message, args=(a, {"op": "hit"}, memfds))
        t.start()
        obj, fds = recv_message(b)
        t.join()
        try:
            assert obj == {"op": "hit"}, "the batching key must not leak into the message"
            assert len(fds) == count
            assert [os.fstat(fd).st_ino for fd in fds] == [os.fstat(fd).st_ino for fd in memfds]
        finally:
            close_fds(fds)
    finally:
        close_fds(memfds)


def test_received_fds_are_close_on_exec(pair):
    a, b = pair
    fd = os.memfd_create("x")  # without MFD_CLOEXEC
    os.set_inheritable(fd, True)
    try:
        send_message(a, {}, [fd])
        _, fds = recv_message(b)
        assert fcntl.fcntl(fds[0], fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        close_fds(fds)
    finally:
        os.close(fd)


def test_short_reads_reassemble_the_frame(pair):
    a, b = pair
    payload = json.dumps({"op": "get", "key": "k" * 5000}).encode()
    frame = struct.pack(">I", len(payload)) + payload

    def dribble():
        # Uneven pieces, each flushed separately, so the reader sees partial header and payload reads.
        pos, step = 0, 1
        while pos < len(frame):
            a.sendall(frame[pos:pos + step])
            pos += step
            step = step * 3 + 1
            time.sleep(0.001)

    t = threading.Thread(target=dribble)
    t.start()
    obj, fds = recv_message(b)
    t.join()
    assert obj == {"op": "get", "key": "k" * 5000}
    assert fds == []


def test_peer_closing_before_a_frame_raises_connection_closed(pair):
    a, b = pair
    a.close()
    with pytest.raises(ConnectionClosed) as info:
        recv_message(b)
    assert isinstance(info.value, ConnectionError)


def test_peer_closing_mid_frame_raises_connection_closed(pair):
    a, b = pair
    a.sendall(struct.pack(">I", 100) + b'{"op":')
    a.close()
    with pytest.raises(ConnectionClosed, match="middle of a frame"):
        recv_message(b)


def test_oversized_length_is_refused(pair):
    a, b = pair
    a.sendall(struct.pack(">I", MAX_FRAME_BYTES + 1))
    with pytest.raises(FrameError, match="limit"):
        recv_message(b)


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_garbage_payload_is_refused_and_its_fds_closed(pair, payload):
    a, b = pair
    fd = os.memfd_create("x")
    try:
        socket.send_fds(a, [struct.pack(">I", len(payload))[:1]], [fd])
        a.sendall(struct.pack(">I", len(payload))[1:] + payload)
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(FrameError):
            recv_message(b)
        assert set(os.listdir("/proc/self/fd")) <= before, "fds of a refused frame must be closed"
    finally:
        os.close(fd)


def test_inconsistent_follow_up_frame_is_refused(pair):
    a, b = pair
    send_message(a, {"op": "x", "more_fds": 2})  # announces fds that never come
    send_message(a, {"op": "not a follow-up"})
    with pytest.raises(FrameError, match="follow-up"):
        recv_message(b)


def test_the_servers_outbox_frames_as_send_message_does(pair):
    """One codec: the server's non-blocking outbox queues the very frames ``send_message`` sends, and what either
    sends, ``recv_message`` reads (as ``overmind run`` and its templates do too)."""
    from overmind.ipc.protocol import frames
    from overmind.server.wire import Outbox

    a, b = pair
    memfds = [os.memfd_create(f"f{i}") for i in range(MAX_FDS_PER_FRAME + 3)]
    try:
        outbox = Outbox()
        outbox.put({"op": "hit", "n": 1}, [os.dup(fd) for fd in memfds])  # the outbox owns (and closes) these
        assert [seg[0] for seg in outbox._segments] == [data for data, _ in frames({"op": "hit", "n": 1}, memfds)]
        assert outbox.flush(a)
        got, fds = recv_message(b)
        assert got == {"op": "hit", "n": 1} and len(fds) == len(memfds)
        close_fds(fds)
    finally:
        close_fds(memfds)
