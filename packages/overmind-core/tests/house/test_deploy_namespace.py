"""The node-local deployment of docs/deployment.md, as a container would see it: a client in its own
PID and mount namespace (and user namespace, mapping the same uid), which sees the runtime directory only where
the pod would mount it (the host's path and the default runtime directory are hidden under empty tmpfs), gets a zero-copy hit on what a host process published."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import overmind
from overmind.testing import run_fresh

UNSHARE = ["unshare", "--user", "--map-current-user", "--pid", "--mount", "--fork", "--mount-proc"]
SUPPORT = str(pathlib.Path(__file__).resolve().parents[4] / "tests")  # tests/_support: outside /tmp


def _namespaces_problem() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"the kernel or its policy forbids user+PID+mount namespaces here: {probe.stderr.strip()}"
    return None


def test_a_client_in_its_own_pid_and_mount_namespace_gets_a_zero_copy_hit(overmind_runtime):
    problem = _namespaces_problem()
    if problem:
        pytest.skip(problem)
    published = run_fresh(f"""
        import sys; sys.path.insert(0, {SUPPORT!r})
        import overmind
        from _support import fault_loaders as L
        from overmind.testing import report
        overmind.load(L.build, 5)
        report("ok")
    """)
    assert published == "ok"
    # In the namespaces: the runtime directory is bind-mounted at /mnt, then its host path and the default
    # runtime directory are covered by empty tmpfs, so /mnt is the only way to the server. (Not all of /tmp:
    # the checkout and its venv may live there, as on a CI machine.)
    client = textwrap.dedent(f"""
        import json, os, sys, torch
        sys.path.insert(0, {SUPPORT!r})
        import overmind
        from _support import fault_loaders as L
        from overmind.testing import overmind_mapped
        t = overmind.load(L.build, 5)
        print(json.dumps({{"pid": os.getpid(), "mapped": overmind_mapped(t.data_ptr()),
                          "equal": bool(torch.equal(t, L.expected(5))),
                          "hidden": sorted(os.listdir({overmind_runtime!r})),
                          "entries": len(overmind.cache_info().entries)}}))
    """)
    default_dir = f"/tmp/overmind-{os.getuid()}"
    script = (f"mount --bind {overmind_runtime} /mnt && mount -t tmpfs tmpfs {overmind_runtime} && "
              f"{{ [ ! -d {default_dir} ] || mount -t tmpfs tmpfs {default_dir}; }} && "
              f"exec env OVERMIND_RUNTIME_DIR=/mnt OVERMIND_STRICT=1 {sys.executable} -c \"$0\"")
    out = subprocess.run([*UNSHARE, "sh", "-c", script, client], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["pid"] == 1 and seen["hidden"] == []  # its own PID namespace; the host's path shows nothing
    assert seen["mapped"] and seen["equal"] and seen["entries"] == 1, seen
    (entry,) = overmind.cache_info().entries
    assert entry.hits == 1  # served to the namespaced client, not published again


def test_the_kubernetes_layout_shares_one_directory_at_one_uid():
    """deploy/kubernetes (shown in docs/deployment.md): the DaemonSet and the workload mount the same hostPath where
    OVERMIND_RUNTIME_DIR points, as the same uid."""
    yaml = pytest.importorskip("yaml")
    folder = pathlib.Path(SUPPORT).parent / "deploy" / "kubernetes"
    (daemonset,) = [d for d in yaml.safe_load_all((folder / "overmind-daemonset.yaml").read_text())
                    if d and d["kind"] == "DaemonSet"]
    (workload,) = [d for d in yaml.safe_load_all((folder / "inference-deployment.yaml").read_text())
                   if d and d["kind"] == "Deployment"]

    def layout(spec):
        (container,) = spec["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        (name,) = [n for n, path in mounts.items() if path == env["OVERMIND_RUNTIME_DIR"]]
        uid = container.get("securityContext", {}).get("runAsUser") or spec["securityContext"]["runAsUser"]
        return paths[name], uid, container

    node_dir, server_uid, server = layout(daemonset["spec"]["template"]["spec"])
    pod_dir, pod_uid, _ = layout(workload["spec"]["template"]["spec"])
    assert node_dir == pod_dir and server_uid == pod_uid
    assert server["command"][:2] == ["overmind", "serve"]
