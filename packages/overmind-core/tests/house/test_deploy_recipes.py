"""The deployment recipes of deploy/ (docs/deployment.md shows them): the systemd user unit and the Kubernetes
manifests, and the server's readiness report to systemd (``Type=notify``) that the unit relies on.

- The server sends ``READY=1`` to ``$NOTIFY_SOCKET`` once its socket accepts (a real server, a datagram socket
  this test binds); a server that a client starts on demand never inherits the variable.
- The unit: ``systemd-analyze security`` rates it below 4, ``systemd-analyze verify`` finds nothing to say, and
  where a systemd user manager answers, the unit's settings run a real server that is ready when systemd says so.
- The manifests: ``kubernetes-validate --strict`` accepts them, and the checks that need no tool: probes on every
  container, the restricted securityContext, pinned image tags, the init container that waits for the server,
  the fleet key from a Secret volume that only the pod's uid and group read.
- The page shows each file as it is.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import overmind
from overmind.client import launcher
from overmind.client.connection import Client
from overmind.ipc import runtime

ROOT = Path(__file__).resolve().parents[4]
UNIT = ROOT / "deploy/systemd/overmind.service"
MANIFESTS = sorted((ROOT / "deploy/kubernetes").glob("*.yaml"))
PAGE = ROOT / "docs/deployment.md"
EXPOSURE_BELOW = 4.0


# ---- readiness: sd_notify ------------------------------------------------------------------------------
@pytest.fixture
def notify_socket():
    """``(address for $NOTIFY_SOCKET, bound datagram socket)``: a filesystem socket, as systemd gives."""
    folder = tempfile.mkdtemp(prefix="om-notify-", dir="/tmp")  # short: sun_path holds 107 bytes
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    yield path, sock
    sock.close()
    shutil.rmtree(folder, ignore_errors=True)


def _serve(command: list[str], notify: str | None) -> subprocess.Popen:
    env = launcher.server_env()
    if notify is not None:
        env["NOTIFY_SOCKET"] = notify
    return subprocess.Popen([sys.executable, "-m", *command], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _receive(sock: socket.socket, proc: subprocess.Popen, within: float = 30) -> bytes:
    """The next datagram on ``sock``; fails at once, with the server's stderr, if the server exits first."""
    deadline = time.monotonic() + within
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            return sock.recv(4096)
        except TimeoutError:
            if proc.poll() is not None:
                pytest.fail(f"the server exited ({proc.returncode}) without a word: {proc.stderr.read().decode()}")
    pytest.fail(f"nothing on the notify socket within {within} s")


def _stop(proc: subprocess.Popen, directory: str) -> None:
    try:
        Client(directory, autostart=False).stop()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_overmind_serve_reports_ready_once_its_socket_accepts(overmind_runtime, notify_socket):
    address, sock = notify_socket
    proc = _serve(["overmind", "--runtime-dir", overmind_runtime, "serve", "--no-template"], address)
    try:
        message = _receive(sock, proc)
        # Ready means ready: by the time systemd hears it, a client connects and is served.
        assert launcher.accepts(runtime.socket_path(overmind_runtime))
        assert Client(overmind_runtime, autostart=False).status()["pid"] == proc.pid
        fields = dict(line.split("=", 1) for line in message.decode().splitlines())
        assert fields["READY"] == "1", message
        assert fields["STATUS"] == f"serving {runtime.socket_path(overmind_runtime)}"
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(4096)  # once
    finally:
        _stop(proc, overmind_runtime)


def test_an_abstract_notify_socket_is_reached_too(overmind_runtime):
    name = f"overmind-test-notify-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        proc = _serve(["overmind.server", "--runtime-dir", overmind_runtime], "@" + name)
        try:
            assert _receive(sock, proc).startswith(b"READY=1\n")
        finally:
            _stop(proc, overmind_runtime)


def test_a_notify_socket_that_is_gone_is_logged_and_the_server_serves(overmind_runtime):
    missing = f"/tmp/om-notify-missing-{uuid.uuid4().hex}"
    proc = _serve(["overmind.server", "--runtime-dir", overmind_runtime], missing)
    try:
        assert launcher.wait_accepting(runtime.socket_path(overmind_runtime), 30)
        assert Client(overmind_runtime, autostart=False).status()["pid"] == proc.pid
    finally:
        _stop(proc, overmind_runtime)
    log = Path(runtime.log_path(overmind_runtime)).read_text()
    assert f"could not tell the service manager that the server is ready (NOTIFY_SOCKET {missing}" in log


def test_the_variable_is_taken_out_of_the_environment_and_unset_means_nothing(monkeypatch):
    from overmind.server import daemon

    sent = []
    monkeypatch.setattr(daemon.socket, "socket", lambda *a: sent.append(a))
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    daemon._notify_ready("/x/server.sock")
    assert sent == []
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/not/a/socket")
    daemon._notify_ready("/x/server.sock")
    assert sent == [] and "NOTIFY_SOCKET" not in os.environ


def test_a_server_started_on_demand_never_inherits_the_notify_socket(monkeypatch):
    # A client running inside a Type=notify service must not have its on-demand server report that service ready.
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/user/1000/systemd/notify")
    assert "NOTIFY_SOCKET" not in launcher.server_env()


# ---- the systemd unit ----------------------------------------------------------------------------------
def unit_settings(section: str = "Service") -> list[tuple[str, str]]:
    """``(key, value)`` of each setting of ``section`` in the unit, in order (keys may repeat)."""
    out, current = [], None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            continue
        if current == section:
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def test_the_unit_is_notify_hardened_and_its_runtime_directory_is_the_one_writable_place():
    settings = dict(unit_settings())
    assert settings["Type"] == "notify"
    assert settings["ExecStart"].split()[1:] == ["serve", "--no-template"]
    values = " ".join(v for _, v in unit_settings("Unit") + unit_settings() + unit_settings("Install"))
    assert not any(p in values for p in ("/path/to", "<", ">", "example")), f"a placeholder in the unit: {values}"
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "read-only",
                       "PrivateTmp": "yes", "PrivateUsers": "yes", "RestrictAddressFamilies": "AF_UNIX",
                       "CapabilityBoundingSet": "", "UMask": "0077"}.items():
        assert settings.get(key) == value, (key, settings.get(key))
    # ProtectSystem=strict leaves RuntimeDirectory= writable: the server's directory must be that one.
    environment = [v for k, v in unit_settings() if k == "Environment"]
    assert f"OVERMIND_RUNTIME_DIR=%t/{settings['RuntimeDirectory']}" in environment, environment
    assert settings["RuntimeDirectoryMode"] == "0700"


def _systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here")
    return tool


def test_systemd_analyze_security_rates_the_unit_below_4():
    tool = _systemd_analyze()
    # --offline (systemd 252 and later) rates the unit file itself, with no service manager running.
    # --threshold is on the tool's 0-100 scale: it fails when the exposure is above 3.9.
    done = subprocess.run([tool, "security", "--offline=yes", "--no-pager", "--threshold=39", str(UNIT)],
                          capture_output=True, text=True, timeout=120)
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        pytest.skip(f"this systemd-analyze has no --offline: {done.stderr.strip()}")
    level = re.search(r"Overall exposure level for overmind\.service: (\d+\.\d+) (\w+)", done.stdout)
    assert level, done.stdout + done.stderr
    assert float(level.group(1)) < EXPOSURE_BELOW and done.returncode == 0, done.stdout
    not_met = [line for line in done.stdout.splitlines() if line.startswith("✗")]
    print(f"systemd-analyze security: {level.group(1)} {level.group(2)}; not set:\n" + "\n".join(not_met))


def _runnable_unit(folder: Path) -> Path:
    """The unit with ExecStart naming this interpreter: ``verify`` checks that the command exists."""
    text = re.sub(r"^ExecStart=\S+ ", f"ExecStart={sys.executable} -m overmind ", UNIT.read_text(), flags=re.M)
    path = folder / UNIT.name
    path.write_text(text)
    return path


def test_systemd_analyze_verify_has_nothing_to_say_about_the_unit(tmp_path):
    tool = _systemd_analyze()
    done = subprocess.run([tool, "verify", "--man=no", str(_runnable_unit(tmp_path))], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), done.stdout + done.stderr


def _user_manager() -> str:
    systemctl = shutil.which("systemctl")
    if systemctl is None or shutil.which("systemd-run") is None:
        pytest.skip("systemd is not installed here")
    answer = subprocess.run([systemctl, "--user", "show-environment"], capture_output=True, text=True,
                            timeout=30)
    if answer.returncode != 0:
        pytest.skip(f"no systemd user manager answers here ({answer.stderr.strip()})")
    return systemctl


def test_the_units_settings_run_a_server_that_is_ready_when_systemd_says_so():
    """The unit's [Service] settings, as a transient unit of the user manager with its own runtime directory."""
    systemctl = _user_manager()
    name = f"overmind-test-{uuid.uuid4().hex[:12]}"
    directory = os.path.join(os.environ["XDG_RUNTIME_DIR"], name)
    own = {"ExecStart", "Environment", "RuntimeDirectory", "RuntimeDirectoryPreserve", "Restart", "RestartSec",
           "RestartPreventExitStatus"}
    props = [f"--property={k}={v}" for k, v in unit_settings() if k not in own]
    props += [f"--property=RuntimeDirectory={name}", f"--setenv=OVERMIND_RUNTIME_DIR={directory}",
              f"--setenv=PYTHONPATH={launcher.server_env()['PYTHONPATH']}"]
    # Without --no-block, systemd-run returns once the start job is done: for Type=notify, on READY=1.
    started = subprocess.run(["systemd-run", "--user", "--quiet", "--collect", f"--unit={name}", *props,
                              sys.executable, "-m", "overmind", "serve", "--no-template"],
                             capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stderr
        status = Client(directory, autostart=False).status()  # no wait: ready means accepting
        shown = subprocess.run([systemctl, "--user", "show", "--property=MainPID,ActiveState,StatusText", name],
                               capture_output=True, text=True, timeout=30).stdout
        fields = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        assert fields["ActiveState"] == "active" and int(fields["MainPID"]) == status["pid"], shown
        assert fields["StatusText"] == f"serving {runtime.socket_path(directory)}"
        rated = subprocess.run(["systemd-analyze", "security", "--user", "--no-pager", name], capture_output=True,
                               text=True, timeout=120)
        level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", rated.stdout)
        assert level and float(level.group(1)) < EXPOSURE_BELOW, rated.stdout + rated.stderr
    finally:
        subprocess.run([systemctl, "--user", "stop", name], capture_output=True, timeout=60)
        subprocess.run([systemctl, "--user", "reset-failed", name], capture_output=True, timeout=60)


# ---- the Kubernetes manifests --------------------------------------------------------------------------
try:
    import yaml  # PyYAML: mkdocs brings it (scripts/requirements.txt)
except ImportError:  # pragma: no cover - the manifests' tests then skip
    yaml = None


def documents() -> list[tuple[Path, dict]]:
    if yaml is None:
        pytest.skip("PyYAML is not installed here")
    out = []
    for path in MANIFESTS:
        out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def pod_specs() -> list[tuple[str, dict]]:
    """``(name, pod spec)`` of every workload in the manifests (none without PyYAML: those tests skip)."""
    if yaml is None:
        return []
    return [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"])
            for path, doc in documents() if doc["kind"] in ("DaemonSet", "Deployment")]


def test_there_are_the_manifests_the_docs_name():
    kinds = {(path.name, doc["kind"]) for path, doc in documents()}
    assert kinds == {("namespace.yaml", "Namespace"), ("overmind-daemonset.yaml", "DaemonSet"),
                     ("inference-deployment.yaml", "Deployment"), ("overmind-sidecar.yaml", "Deployment"),
                     ("overmind-fleet.yaml", "ConfigMap"), ("overmind-fleet.yaml", "Secret")}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kubernetes_validate_strict_accepts_the_manifest(path):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is pinned in "
                                                           "scripts/requirements.txt; run scripts/setup")
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            kv.validate(doc, kv.latest_version(), strict=True)  # raises ValidationError naming the field


def test_kubernetes_validate_strict_would_catch_a_misspelt_field():
    kv = pytest.importorskip("kubernetes_validate")
    doc = yaml.safe_load((ROOT / "deploy/kubernetes/overmind-daemonset.yaml").read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 10
    with pytest.raises(kv.ValidationError, match="periodSecond"):
        kv.validate(doc, kv.latest_version(), strict=True)


def _containers(spec: dict) -> list[tuple[str, dict]]:
    return [("init", c) for c in spec.get("initContainers", [])] + [("main", c) for c in spec["containers"]]


def _is_server(container: dict) -> bool:
    return container.get("command", [])[:2] == ["overmind", "serve"]


@pytest.mark.parametrize("name, spec", pod_specs(), ids=[n for n, _ in pod_specs()])
def test_every_container_is_restricted_and_pinned(name, spec):
    pod = spec.get("securityContext", {})
    assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, name
    assert spec.get("automountServiceAccountToken") is False, name
    for kind, c in _containers(spec):
        ctx = {**pod, **c.get("securityContext", {})}
        where = f"{name} {kind} container {c['name']}"
        assert ctx.get("allowPrivilegeEscalation") is False, where
        assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
        assert ctx.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert not ctx.get("privileged"), where
        if c["name"] == "runtime-dir":  # the one root container: chown/chmod of the hostPath directory
            assert ctx["runAsUser"] == 0 and set(ctx["capabilities"]["add"]) == {"CHOWN", "FOWNER"}, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
        else:
            assert ctx.get("runAsNonRoot") is True and ctx.get("runAsUser", 0) > 0, where
            assert not ctx.get("capabilities", {}).get("add"), where
        image = c["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag and tag not in ("", "latest"), f"{where}: image {image} is not pinned"
        if "overmind-server" in repo:
            assert tag == overmind.__version__, f"{where}: {image} is not this overmind ({overmind.__version__})"
        assert c.get("resources", {}).get("limits", {}).get("memory"), where


@pytest.mark.parametrize("name, spec", pod_specs(), ids=[n for n, _ in pod_specs()])
def test_every_container_has_probes_and_the_servers_ask_overmind_status(name, spec):
    for kind, c in _containers(spec):
        where = f"{name} {kind} container {c['name']}"
        sidecar = kind == "init" and c.get("restartPolicy") == "Always"
        if kind == "init" and not sidecar:
            assert not any(p in c for p in ("readinessProbe", "livenessProbe")), where  # not allowed there
            continue
        assert "readinessProbe" in c and "livenessProbe" in c, where
        if _is_server(c):
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["exec"]["command"] == ["overmind", "status"], where
            directory = next(e["value"] for e in c["env"] if e["name"] == "OVERMIND_RUNTIME_DIR")
            mounted = c["volumeMounts"][0]["mountPath"]
            assert directory == mounted or directory.startswith(mounted + "/"), where
    if any(_is_server(c) and kind == "init" for kind, c in _containers(spec)):  # a sidecar server
        server = next(c for kind, c in _containers(spec) if _is_server(c))
        assert server["restartPolicy"] == "Always" and server["startupProbe"]["exec"]["command"] == \
            ["overmind", "status"], name


def _manifest(filename: str) -> dict:
    return next(doc for path, doc in documents() if path.name == filename and doc["kind"] != "Namespace")


def test_the_workload_waits_for_the_nodes_server_in_an_init_container_with_its_uid_and_directory():
    daemonset = _manifest("overmind-daemonset.yaml")["spec"]["template"]["spec"]
    workload = _manifest("inference-deployment.yaml")["spec"]["template"]["spec"]
    wait = next(c for c in workload["initContainers"] if c["name"] == "wait-for-overmind")
    script = wait["command"][-1]
    assert re.fullmatch(r"until overmind status >/dev/null; do .*sleep \d+; done", script), script
    assert workload["securityContext"]["runAsUser"] == daemonset["securityContext"]["runAsUser"]
    server_dir = next(v["hostPath"]["path"] for v in daemonset["volumes"] if "hostPath" in v)
    assert [v["hostPath"]["path"] for v in workload["volumes"] if "hostPath" in v] == [server_dir]
    for c in (wait, *workload["containers"]):
        assert {"name": "OVERMIND_RUNTIME_DIR", "value": server_dir} in c["env"], c["name"]
    assert daemonset.get("hostUsers", True) and workload.get("hostUsers", True)  # same uid on both sides
    strategy = _manifest("overmind-daemonset.yaml")["spec"]["updateStrategy"]["rollingUpdate"]
    assert strategy["maxSurge"] == 0  # a second server on the directory would never be ready


def _fleet_documents(kind: str, name: str) -> dict:
    return next(doc for path, doc in documents()
                if path.name == "overmind-fleet.yaml" and doc["kind"] == kind and doc["metadata"]["name"] == name)


@pytest.mark.parametrize("filename, container", [("overmind-daemonset.yaml", "server"),
                                                 ("inference-deployment.yaml", "model")])
def test_the_fleet_key_is_a_file_of_a_secret_volume_that_only_the_pods_uid_and_group_read(filename, container):
    """The server signs uploads and the model container verifies imports with the fleet key: each reads it from a
    file of a Secret volume (never an environment value), owner-only, through the pod's fsGroup."""
    from overmind.fleet.config import MIN_KEY_BYTES
    from overmind.settings import parse_store_url

    doc = _manifest(filename)
    spec = doc["spec"]["template"]["spec"]
    c = next(c for c in spec["containers"] if c["name"] == container)
    env = {e["name"]: e for e in c.get("env", [])}
    assert "value" in env.get("OVERMIND_FLEET_KEY_FILE", {}), f"{filename}: {container} sets no OVERMIND_FLEET_KEY_FILE"
    key_file = env["OVERMIND_FLEET_KEY_FILE"]["value"]
    mount = next((m for m in c["volumeMounts"] if key_file.startswith(m["mountPath"].rstrip("/") + "/")), None)
    assert mount is not None, f"{filename}: no volume of {container} holds {key_file}"
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert "secret" in volume, f"{filename}: {key_file} is on volume {volume}, not a Secret"
    assert mount.get("readOnly") is True, mount
    secret = volume["secret"]
    assert secret["defaultMode"] & 0o077 == 0, f"{filename}: the key's mode {secret['defaultMode']:o} lets others read"
    # A Secret volume's files are root's; the kubelet gives them the pod's fsGroup (and g+r) so the uid reads them.
    assert spec["securityContext"].get("fsGroup") == spec["securityContext"]["runAsGroup"], filename
    item = key_file[len(mount["mountPath"].rstrip("/")) + 1:]
    assert "/" not in item and not secret.get("items"), key_file
    manifest = _fleet_documents("Secret", secret["secretName"])
    placeholder = {**manifest.get("data", {}), **manifest.get("stringData", {})}[item]
    assert len(placeholder.strip()) < MIN_KEY_BYTES, "the example key must be refused, never used as a key"
    assert not any(k.startswith("OVERMIND_FLEET") for k in env if k != "OVERMIND_FLEET_KEY_FILE"), env
    sources = {next(iter(s.values()))["name"]: s for s in c.get("envFrom", [])}
    settings = _fleet_documents("ConfigMap", "overmind-fleet")["data"]
    assert "overmind-fleet" in sources and "configMapRef" in sources["overmind-fleet"], c.get("envFrom")
    assert parse_store_url(settings["OVERMIND_FLEET"])[0] == "s3", settings
    credentials = _fleet_documents("Secret", "overmind-fleet-s3")["stringData"]
    assert "secretRef" in sources["overmind-fleet-s3"] and set(credentials) == {"AWS_ACCESS_KEY_ID",
                                                                                 "AWS_SECRET_ACCESS_KEY"}
    assert not any(k.startswith("AWS_") for k in env), f"{filename}: S3 settings come from the ConfigMap and Secret"


def test_hostpath_pods_live_in_a_privileged_namespace_and_the_sidecar_recipe_needs_no_hostpath():
    # Pod Security "baseline" (and "restricted") reject hostPath volumes.
    namespace = next(doc for _, doc in documents() if doc["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for path, doc in documents():
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if spec is None:
            continue
        if any("hostPath" in v for v in spec.get("volumes", [])):
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], path.name
        else:
            assert {next(k for k in v if k != "name") for v in spec["volumes"]} <= {"emptyDir"}, path.name


# ---- the page ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [UNIT, *MANIFESTS], ids=lambda p: p.name)
def test_the_page_shows_each_file_as_it_is(path):
    relative = path.relative_to(ROOT).as_posix()
    lang = "ini" if path.suffix == ".service" else "yaml"
    block = f"`{relative}`:\n\n```{lang}\n{path.read_text()}```"
    assert block in PAGE.read_text(), f"docs/deployment.md does not show {relative} as it is (a `{relative}`: " \
                                      f"line, a blank line, then the file in a ```{lang} block)"
