"""The ``overmind`` CLI in the style of ``hf cache`` and the typed API behind it: ``ls`` fitted to
the terminal, showing the part of the arguments that tells entries apart, sorting and filtering, own versus
referenced bytes and the processes mapping an entry; ``evict`` by any unique prefix, with ``--dry-run``;
``--json`` on every command; no traceback on a closed pipe; ``--version``; the documented exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import overmind
from overmind.cli.commands import EXIT_CODES
from overmind.client.connection import Client
from overmind.inspection import AmbiguousPrefix, CacheEntry, CacheInfo, EvictUsage, NoSuchEntry

LONG = "/srv/models/huggingface/hub/models--org--a-very-long-repository-name/snapshots/0123456789abcdef"


def om(*args: str, rc: int | None = 0, columns: int | None = None, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = str(columns)
    out = subprocess.run([sys.executable, "-m", "overmind", *args], capture_output=True, text=True, timeout=120,
                         env=env, **kw)
    if rc is not None:
        assert out.returncode == rc, (out.returncode, out.stdout, out.stderr)
    return out


@pytest.fixture
def cache(overmind_runtime, sealed_memfd):
    """A server holding: a 'unet' (3000 B) and a 'vae' (5000 B) under long paths differing at the end, a
    pipeline (10 B) referencing both, and an entry whose summary is a multi-line repr."""
    client = Client()
    unet = client.publish("aaaa1111unet", sealed_memfd(b"u" * 3000), meta={
        "loader": "diffusers.models.unets.UNet2DConditionModel.from_pretrained",
        "summary": f"pretrained_model_name_or_path='{LONG}/unet', subfolder=None, dtype=torch.float16"})
    vae = client.publish("aaaa2222vae", sealed_memfd(b"v" * 5000), meta={
        "loader": "diffusers.models.autoencoders.AutoencoderKL.from_pretrained",
        "summary": f"pretrained_model_name_or_path='{LONG}/vae', subfolder=None, dtype=torch.float16"})
    client.publish("bbbb3333pipe", sealed_memfd(b"p" * 10), deps=[unet, vae], meta={
        "loader": "diffusers.pipelines.StableDiffusionPipeline.from_pretrained", "summary": f"'{LONG}'"})
    client.publish("cccc4444conf", sealed_memfd(b"c" * 20), meta={
        "loader": "mylib.load_config", "summary": "config=Config(\n  a=1,\n  b=2\n)"})
    client.get("cccc4444conf").close()
    client.get("cccc4444conf").close()
    yield client
    client.close()


def test_ls_fits_the_terminal_and_shows_what_tells_entries_apart(cache):
    for columns in (70, 100, 160):
        lines = om("ls", columns=columns).stdout.splitlines()
        assert len(lines) == 6, lines  # header, 4 rows (the multi-line repr stays on its row), total
        assert all(len(line) <= columns for line in lines), [len(x) for x in lines]
        unet_row = next(x for x in lines if x.startswith("aaaa1111"))
        vae_row = next(x for x in lines if x.startswith("aaaa2222"))
        assert "/unet" in unet_row and "/vae" in vae_row, lines  # the tails, not the shared prefix
    wide = om("ls").stdout  # a pipe: whole rows
    assert "'…/0123456789abcdef/unet', dtype=torch.float16" in wide and "subfolder=None" not in wide
    assert "config=Config( a=1, b=2 )" in wide
    assert "UNet2DConditionModel.from_pretrained" in wide and "mylib.load_config" in wide


def test_ls_keeps_the_loaders_class_and_its_total_adds_up_to_status(cache):
    from overmind._util.humanize import human_bytes

    for columns in (80, 100):
        lines = om("ls", columns=columns).stdout.splitlines()
        assert all(len(line) <= columns for line in lines), lines
        rows = {line.split()[0]: line for line in lines[1:-1]}
        assert "UNet2DConditionModel" in rows["aaaa1111"] and "AutoencoderKL" in rows["aaaa2222"], lines
        assert "StableDiffusionPipeline" in rows["bbbb3333"], lines
    st = json.loads(om("status", "--json").stdout)
    listed = [json.loads(line) for line in om("ls", "--jsonl").stdout.splitlines()]
    assert len(listed) == 4 and sum(row["nbytes"] for row in listed) == st["bytes"]
    assert om("ls").stdout.splitlines()[-1] == f"4 entries: {human_bytes(st['bytes'])} in shared memory"


def test_ls_sorts_and_filters(cache):
    def order(*args):
        return [line.split()[0] for line in om("ls", *args).stdout.splitlines()[1:-1]]

    assert order("--sort", "size")[:2] == ["bbbb3333", "aaaa2222"]  # own + referenced bytes
    assert order("--sort", "hits")[0] == "cccc4444"
    assert order()[0] == "cccc4444"  # last use, newest first
    assert order("--loader", "autoencoder") == ["aaaa2222"]
    rows = json.loads(om("ls", "--json", "--loader", "UNET").stdout)
    assert [r["key"] for r in rows] == ["aaaa1111unet"]


def test_ls_shows_own_and_referenced_bytes_and_hits(cache):
    rows = {r["key"]: r for r in json.loads(om("ls", "--json").stdout)}
    assert rows["bbbb3333pipe"]["nbytes"] == 10
    assert rows["bbbb3333pipe"]["referenced_nbytes"] == rows["aaaa1111unet"]["nbytes"] + rows["aaaa2222vae"]["nbytes"]
    assert rows["aaaa1111unet"]["referenced_nbytes"] == 0
    assert rows["cccc4444conf"]["hits"] == 2 and rows["aaaa1111unet"]["hits"] == 0  # publishing is no hit
    pipe_row = next(x for x in om("ls").stdout.splitlines() if x.startswith("bbbb3333"))
    assert pipe_row.split()[1:5] == ["10", "B", "7.8", "KiB"], pipe_row


def test_hits_count_each_process_that_was_served(overmind_runtime):
    script = textwrap.dedent("""
        import torch, overmind
        def build(n):
            return torch.arange(n)
        overmind.load(build, 7)
    """)
    for _ in range(3):
        subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    (row,) = json.loads(om("ls", "--json").stdout)
    assert row["hits"] == 2, row  # the first process published, the next two hit
    st = json.loads(om("status", "--json").stdout)
    # the first process's miss (it claimed its key by starting the server) counts as a get
    assert (st["gets"], st["hits"], st["publishes"]) == (3, 2, 1), st


def test_ls_names_the_processes_that_map_an_entry(overmind_runtime):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, torch, overmind
        def build(n):
            return torch.ones(n)
        t = overmind.load(build, 100000)
        print("loaded", flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "loaded"
        (row,) = json.loads(om("ls", "--json").stdout)
        assert row["mapped_by"] == [holder.pid], row
        info = overmind.cache_info()
        assert isinstance(info, CacheInfo) and isinstance(info.entries[0], CacheEntry)
        assert info.entries[0].mapped_by == (holder.pid,)
    finally:
        holder.communicate("\n", timeout=60)
    (row,) = json.loads(om("ls", "--json").stdout)
    assert row["mapped_by"] == []


def test_evict_by_any_unique_prefix_with_dry_run(cache):
    assert "would evict cccc4444conf" in om("evict", "cccc", "--dry-run").stdout
    assert len(json.loads(om("ls", "--json").stdout)) == 4
    ambiguous = om("evict", "aaaa", rc=1)
    assert "matches 2 entries" in ambiguous.stderr and "Traceback" not in ambiguous.stderr
    assert "no cached entry starts with 'zzzz'" in om("evict", "zzzz", rc=1).stderr
    refused = om("evict", "aaaa1", rc=1)
    # the blocker by its ENTRY, as 'overmind ls' shows it, and its loader
    assert "referenced by bbbb3333pipe (StableDiffusionPipeline.from_pretrained)" in refused.stderr
    dry = om("evict", "cccc", "bbbb3", "--dry-run")
    assert "would free 30 B of shared memory (2 entries)" in dry.stdout
    out = json.loads(om("evict", "bbbb3", "aaaa1", "--json").stdout)  # the pipeline first, then its unet
    assert out == {"dry_run": False, "evicted": ["bbbb3333pipe", "aaaa1111unet"], "refused": [], "freed_bytes": 3010}
    entry_id = next(e["entry_id"] for e in cache.ls() if e["key"] == "cccc4444conf")
    assert "evicted cccc4444conf" in om("evict", entry_id[:10]).stdout  # an entry id prefix works too
    with pytest.raises(NoSuchEntry, match="no cached entry starts with 'nothing-like-it'"):
        overmind.evict("nothing-like-it")
    assert overmind.evict(all=True, dry_run=True).evicted == ["aaaa2222vae"]
    assert "evicted aaaa2222vae" in om("evict", "--all").stdout


def test_evict_refuses_what_names_nothing_or_everything_from_python_as_from_the_command(cache):
    with pytest.raises(NoSuchEntry, match="an empty prefix names no entry"):
        overmind.evict("")
    with pytest.raises(EvictUsage, match="not both"):
        overmind.evict("cccc", all=True)
    with pytest.raises(EvictUsage, match="names no entry"):
        overmind.evict()
    with pytest.raises(AmbiguousPrefix, match="matches 2 entries"):
        overmind.evict("aaaa")
    assert len(cache.ls()) == 4  # nothing went
    assert "an empty prefix names no entry" in om("evict", "", rc=1).stderr
    assert "not both" in om("evict", "cccc", "--all", rc=2).stderr
    assert "or give --all" in om("evict", rc=2).stderr and "not both" not in om("evict", rc=2).stderr


def test_evict_with_deps_takes_what_only_the_named_entries_reference(cache):
    dry = overmind.evict("bbbb3", with_deps=True, dry_run=True)
    assert sorted(dry.evicted) == ["aaaa1111unet", "aaaa2222vae", "bbbb3333pipe"] and dry.freed_bytes == 8010
    assert len(cache.ls()) == 4
    out = json.loads(om("evict", "bbbb3", "--with-deps", "--json").stdout)
    assert out["evicted"] == ["bbbb3333pipe", "aaaa1111unet", "aaaa2222vae"] and out["refused"] == []
    assert [e["key"] for e in cache.ls()] == ["cccc4444conf"]


def test_json_on_every_command(cache):
    assert json.loads(om("status", "--json").stdout)["entries"] == 4
    assert len(json.loads(om("ls", "--json").stdout)) == 4
    assert json.loads(om("evict", "cccc", "--dry-run", "--json").stdout)["evicted"] == ["cccc4444conf"]
    doctor = json.loads(om("doctor", "--json").stdout)
    assert doctor["ok"] is True and {c["name"] for c in doctor["checks"]} >= {"memfd", "server"}
    stopped = json.loads(om("stop", "--json").stdout)
    assert stopped["stopped"] is True and isinstance(stopped["pid"], int)
    assert json.loads(om("stop", "--json").stdout) == {"stopped": False, "pid": None, "how": None, "note": ""}


def test_status_reports_hit_rate_and_bytes_served(cache):
    st = json.loads(om("status", "--json").stdout)
    assert st["gets"] == 2 and st["hits"] == 2 and st["publishes"] == 4 and st["bytes_served"] == 2 * 20
    assert "2 of 2 gets (100%), 40 B served; 4 published, 0 evicted" in om("status").stdout


def test_a_closed_pipe_ends_quietly(cache):
    for args in (("ls", "--json"), ("ls",), ("status", "--json"), ("doctor",)):
        proc = subprocess.Popen([sys.executable, "-m", "overmind", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.close()  # as 'head' does once it has its lines
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_version_exit_codes_and_no_server(overmind_runtime):
    assert om("--version").stdout.strip() == f"overmind {overmind.__version__}"
    assert set(EXIT_CODES) == {0, 1, 2, 3, 130, 141}  # 3: serve, another server serves (test_cli_json_serve_run)
    assert "exit status: 0 done; 1 failed" in " ".join(om("--help").stdout.split())
    assert "no server is running" in om("ls", rc=1).stderr
    assert "no server is running" in om("evict", "abc", rc=1).stderr
    assert "name entries" in om("evict", rc=2).stderr
    assert om("ls", "--sort", "colour", rc=2).returncode == 2
    assert overmind.cache_info().running is False


def test_the_package_is_typed():
    assert os.path.isfile(os.path.join(os.path.dirname(overmind.__file__), "py.typed"))


def test_doctor_says_each_thing_once_without_raw_markers(overmind_runtime):
    """A skipped adapter's line names it once and shows its requirement without the raw environment marker."""
    out = om("doctor").stdout
    lines = [line for line in out.splitlines() if line.startswith("[") and "adapter " in line]
    assert lines, out
    for line in lines:
        assert "extra ==" not in line and line.count("overmind:") == 0, line
        name = line.split("adapter ", 1)[1].split(":", 1)[0]
        assert line.count(f"adapter {name}") == 1, line
