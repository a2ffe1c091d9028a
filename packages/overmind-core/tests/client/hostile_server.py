"""An attacker's stand-in for the hostile-server test (stdlib only; run as another user, by path).

``python3 hostile_server.py PARENT VICTIM_NAME CTL_FD ACK_FD PROTOCOL``: in the shared writable ``PARENT``, make the
directory ``PARENT/evil-<pid>`` with a listening ``server.sock`` that answers any hello with an ok in the victim's ``PROTOCOL``. Each byte
``s`` read from ``CTL_FD`` exchanges that directory with the victim's runtime directory ``PARENT/VICTIM_NAME``
(``renameat2(RENAME_EXCHANGE)``) and answers ``k`` on ``ACK_FD``: the victim's test asks for the swap at the
worst moment, after its checks passed and before its ``connect()``, so the race is won every time instead of
now and then. ``q`` (or the end of ``CTL_FD``) stops it, with the victim's directory always left in place.
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


def main(parent, victim_name, ctl_fd, ack_fd, protocol):
    libc = ctypes.CDLL(None, use_errno=True)
    evil = os.path.join(parent, f"evil-{os.getpid()}")
    os.mkdir(evil, 0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(evil, "server.sock"))
    os.chmod(os.path.join(evil, "server.sock"), 0o777)
    listener.listen(128)
    counts = {"connections": 0, "spoke": 0, "swaps": 0}
    lock = threading.Lock()

    def serve(conn):
        conn.settimeout(2)
        try:
            if conn.recv(1):
                with lock:
                    counts["spoke"] += 1
                body = json.dumps({"ok": True, "protocol": protocol, "server_pid": os.getpid(), "version": "x"}).encode()
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
            with lock:
                counts["connections"] += 1
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    def exchange():
        if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2 failed")

    threading.Thread(target=accept_loop, daemon=True).start()
    a, b = os.fsencode(os.path.join(parent, victim_name)), os.fsencode(evil)
    swapped = False
    try:
        while True:
            order = os.read(ctl_fd, 1)
            if order != b"s":
                break
            exchange()
            swapped = not swapped
            counts["swaps"] += 1
            os.write(ack_fd, b"k")
    finally:
        if swapped:
            exchange()  # the victim's directory back in place
    time.sleep(0.5)  # let the last connections be accepted and say whatever they will
    with lock, open(os.path.join(parent, "attacker.json"), "w") as f:
        json.dump(counts, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
