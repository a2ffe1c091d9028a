"""The table of wire ops (overmind/ipc/ops.py) is what the daemons serve and the clients send: every op has
its handler in the daemon that serves it and every handler its row, a request that lacks a declared field
gets the one clear error reply from either daemon, and the server's replies carry the fields the table
declares, against a real server process."""
from __future__ import annotations

import os
import re
import selectors
import socket

import pytest

from overmind.client.connection import Client
from overmind.errors import ServerError
from overmind.ipc import ops
from overmind.ipc.protocol import PROTOCOL_VERSION, ConnectionClosed, recv_message, send_message
from overmind.runner.template import Template
from overmind.server.connection import Connection

DAEMONS = [(Connection, ops.SERVER), (Template, ops.TEMPLATE)]
# A value of the right kind for every request field the server reads (the test removes one at a time).
SAMPLE = {"key": "k", "nbytes": 1, "entry_id": "e", "entry_ids": [], "keys": [], "parts": []}


@pytest.mark.parametrize("cls, daemon", DAEMONS, ids=[d for _, d in DAEMONS])
def test_every_op_has_a_handler_in_the_daemon_that_serves_it_and_every_handler_a_row(cls, daemon):
    methods = {name[len("_op_"):] for name in dir(cls) if name.startswith("_op_")}
    assert methods == {op.name for op in ops.served_by(daemon)}
    assert set(ops.handlers(cls, daemon)) == methods


def test_a_daemon_whose_handlers_and_rows_disagree_fails_at_import():
    class Lacking:
        def _op_info(self): ...

        def _op_frobnicate(self): ...

    with pytest.raises(LookupError, match=r"without a method: \['run'\].*without a row: \['frobnicate'\]"):
        ops.handlers(Lacking, ops.TEMPLATE)


def test_the_table_is_consistent():
    assert all(op.daemon in (ops.SERVER, ops.TEMPLATE) for op in ops.OPS.values())
    assert all(1 <= op.since <= PROTOCOL_VERSION for op in ops.OPS.values())
    for op in ops.OPS.values():
        names = [f.name for f in op.request]
        assert len(names) == len(set(names)) and not {"op", "id", "more_fds"} & set(names), op
        assert op.about and not {"ok", "error", "id"} & {f.name for f in op.reply}, op


def test_the_cli_docstring_shows_the_protocol_this_code_speaks():
    from overmind.cli import main

    assert re.findall(r"protocol (\d+)", main.__doc__) == [str(PROTOCOL_VERSION)]


# ---- the server -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [op for op in ops.served_by(ops.SERVER)
                                if op.name != "hello" and any(not f.optional for f in op.request)],
                         ids=lambda op: op.name)
def test_a_server_request_missing_a_declared_field_gets_the_clear_error_reply(overmind_runtime, op):
    c = Client()
    for field in (f for f in op.request if not f.optional):
        msg = {"op": op.name, **{f.name: SAMPLE[f.name] for f in op.request if not f.optional}}
        del msg[field.name]
        with pytest.raises(ServerError, match=f"op '{op.name}' lacks its field '{field.name}'") as info:
            c._request(msg)
        assert info.value.reason == "bad request"
    assert c.status()["clients"] == 1, "the connection survives"


def test_a_hello_missing_its_protocol_is_refused_and_the_connection_closed(overmind_runtime):
    Client().status()  # start the server
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.join(overmind_runtime, "server.sock"))
    try:
        send_message(sock, {"op": "hello", "pid": os.getpid()})
        reply, _ = recv_message(sock)
        assert reply["ok"] is False and reply["reason"] == "bad request"
        assert "lacks its field 'protocol'" in reply["error"]
        with pytest.raises(ConnectionClosed):
            recv_message(sock)
    finally:
        sock.close()


def test_the_client_checks_a_request_against_the_table_before_sending_it(overmind_runtime):
    c = Client(autostart=False)
    with pytest.raises(ops.RequestError, match="missing: \\['key'\\]"):
        c.call("get")
    with pytest.raises(ops.RequestError, match="undeclared: \\['bogus'\\]"):
        c.call("release", key="k", bogus=1)
    with pytest.raises(ops.RequestError, match="not the server's"):
        c.call("info")
    assert not c._conns, "nothing was sent"


def test_the_server_replies_with_the_fields_the_table_declares(overmind_runtime, sealed_memfd):
    c = Client()
    seen: dict[str, dict] = {}

    def check(name: str, reply: dict, fds: list[int] = ()) -> dict:
        for fd in fds:
            os.close(fd)
        op = ops.OPS[name]
        assert set(reply) - {"ok", "id"} <= {f.name for f in op.reply}, name
        assert {f.name for f in op.reply if not f.optional} <= set(reply), name
        seen[name] = reply
        return reply

    c.status()
    check("hello", c.server_info)
    check("get", *c.call("get", key="k1", wait=False))
    check("admit", *c.call("admit", key="k1", nbytes=100))
    published = check("publish", *c._call("publish", {"key": "k1"}, [sealed_memfd(b"x" * 100)]))
    entry_id = published["entry_id"]
    check("get", *c.call("get", key="k1"))
    check("fds", *c.call("fds", entry_ids=[entry_id]))
    check("blobs", *c.call("blobs", keys=["123:" + "0" * 32]))
    check("get", *c.call("get", key="k2"))
    check("first_done", *c.call("first_done", key="k2", nbytes=5))
    check("get", *c.call("get", key="k3"))
    check("release", *c.call("release", key="k3"))
    check("get", *c.call("get", key="k4"))
    part = {"entry_id": "e-0", "kind": "entry", "digest": "0" * 64}
    check("adopt", *c._call("adopt", {"key": "k4", "parts": [part]},
                            [sealed_memfd(b"y" * 100), sealed_memfd(b"z" * 100)]))
    check("status", *c.call("status"))
    check("ls", *c.call("ls"))
    check("bad", *c.call("bad", key="k1", entry_id=entry_id))
    check("evict", *c.call("evict", all=True))
    check("stop", c.stop())
    assert set(seen) == {op.name for op in ops.served_by(ops.SERVER)}, "ask each server op here once"


# ---- the template ---------------------------------------------------------------------------------------
@pytest.fixture
def template(overmind_runtime):
    """A template that has not imported or bound anything: its request handling, on a socket pair."""
    t = Template(overmind_runtime, [])
    t.info = {"id": "test"}
    yield t
    t.sel.close()


def _ask(template: Template, msg: dict, fds: list[int] = ()) -> dict:
    ours, theirs = socket.socketpair()
    with ours:
        template.sel.register(theirs, selectors.EVENT_READ, ("request", None))
        send_message(ours, msg, fds)
        assert template._request(theirs) is None
        reply, got = recv_message(ours)
        assert not got
        return reply


def test_a_template_request_missing_a_declared_field_gets_the_clear_error_reply(template):
    reply = _ask(template, {"op": "run", "program": {}})
    assert reply["ok"] is False
    assert reply["error"].startswith("op 'run' lacks its fields 'path0', 'orig_argv', 'env', 'fds'")


def test_the_template_answers_in_the_reply_shape_of_the_server(template):
    assert _ask(template, {"op": "info"}) == {"ok": True, "info": {"id": "test"}}
    unknown = _ask(template, {"op": "get", "key": "k"})
    assert unknown["ok"] is False and "unknown op 'get'; this template" in unknown["error"]
    template.stopping = True
    run = {"op": "run", **{f.name: None for f in ops.OPS["run"].request}}
    r, w = os.pipe()
    try:
        assert _ask(template, run, [r, w]) == {"ok": False, "error": "the template is stopping"}
    finally:
        os.close(r)
        os.close(w)
