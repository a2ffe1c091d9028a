"""Content digests (keys/content_digest.py): a file's sha256, remembered per process and in an sqlite file the
user's processes share, never read for a Hugging Face cache blob, and never failing a load over the sqlite file."""
from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from overmind.keys import content_digest

BLOB = "a" * 64


@pytest.fixture
def digests(tmp_path, monkeypatch):
    """A private user cache folder and a process that has remembered nothing; returns the sqlite file's path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(content_digest, "_memory", {})
    monkeypatch.setattr(content_digest, "_db", None)
    monkeypatch.setattr(content_digest, "_db_failed_pid", 0)
    return content_digest.db_path()


@pytest.fixture
def reads(monkeypatch):
    """The files this process reads to hash them, in order."""
    seen: list[str] = []
    real_read = content_digest._read

    def counting(path):
        seen.append(path)
        return real_read(path)

    monkeypatch.setattr(content_digest, "_read", counting)
    return seen


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_is_the_sha256_of_its_bytes_through_links(tmp_path, digests):
    (tmp_path / "w.bin").write_bytes(b"weights")
    os.symlink(tmp_path / "w.bin", tmp_path / "link.bin")
    assert content_digest.digest(str(tmp_path / "w.bin")) == _sha(b"weights")
    assert content_digest.digest(str(tmp_path / "link.bin")) == _sha(b"weights")


def _hf_cache(root, blob_name: str, content: bytes) -> str:
    """``<root>/models--org--tiny`` with one blob and a snapshot file linking to it, as huggingface_hub lays it out."""
    repo = root / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    snap = repo / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (repo / "blobs" / blob_name).write_bytes(content)
    os.symlink(os.path.join("..", "..", "blobs", blob_name), snap / "model.safetensors")
    return str(snap / "model.safetensors")


def test_a_hugging_face_lfs_blob_is_its_name_unread(tmp_path, digests, reads):
    # The blob's bytes are not what its name says: only a digest that never read them returns the name.
    snapshot_file = _hf_cache(tmp_path, BLOB, b"not the bytes the name hashes")
    assert content_digest.digest(snapshot_file) == BLOB
    assert reads == []


def test_git_blobs_and_look_alikes_outside_a_hub_cache_are_read(tmp_path, digests, reads):
    small = _hf_cache(tmp_path, "b" * 40, b"{}")  # a small file's blob: named by git's sha1, read
    assert content_digest.digest(small) == _sha(b"{}")
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / BLOB).write_bytes(b"x")  # a 64-hex name, but no models--* repository above it
    assert content_digest.digest(str(tmp_path / "blobs" / BLOB)) == _sha(b"x")
    assert len(reads) == 2


def test_a_file_is_read_once_per_version(tmp_path, digests, reads, monkeypatch):
    monkeypatch.setattr(content_digest, "RACY_NS", 0)
    f = tmp_path / "w.bin"
    f.write_bytes(b"one")
    assert content_digest.digest(str(f)) == content_digest.digest(str(f)) == _sha(b"one")
    assert len(reads) == 1
    st = os.stat(f)
    f.write_bytes(b"two")  # same size, same mtime put back: ctime still moves
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert content_digest.digest(str(f)) == _sha(b"two")
    assert len(reads) == 2


def test_a_file_changed_just_now_is_read_every_time(tmp_path, digests, reads):
    # Within one timestamp tick a second write could keep the file's identity: nothing is remembered.
    f = tmp_path / "w.bin"
    f.write_bytes(b"fresh")
    content_digest.digest(str(f))
    content_digest.digest(str(f))
    assert len(reads) == 2
    assert not os.path.exists(digests) or not sqlite3.connect(digests).execute("SELECT * FROM digests").fetchall()


_SECOND_PROCESS = textwrap.dedent("""
    import sys
    from overmind.keys import content_digest
    content_digest.RACY_NS = 0
    print(content_digest.digest(sys.argv[1]))
""")


def _digest_in_another_process(path: str) -> str:
    out = subprocess.run([sys.executable, "-c", _SECOND_PROCESS, path], capture_output=True, text=True,
                         check=True, env=os.environ.copy())
    return out.stdout.strip()


def test_another_process_finds_the_digest_in_the_sqlite_file(tmp_path, digests, monkeypatch):
    monkeypatch.setattr(content_digest, "RACY_NS", 0)
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights")
    assert content_digest.digest(str(f)) == _sha(b"weights")
    st = os.stat(f)
    with sqlite3.connect(digests) as db:
        rows = db.execute("SELECT dev, ino, size, mtime_ns, ctime_ns, sha256 FROM digests").fetchall()
        assert rows == [(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, _sha(b"weights"))]
        # A value only the file holds: the second process answers with it, so it did not read the weights.
        db.execute("UPDATE digests SET sha256 = ?", ("f" * 64,))
    assert _digest_in_another_process(str(f)) == "f" * 64


def test_a_digest_another_process_stored_is_used_here(tmp_path, digests, reads, monkeypatch):
    monkeypatch.setattr(content_digest, "RACY_NS", 0)
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights")
    assert _digest_in_another_process(str(f)) == _sha(b"weights")
    assert content_digest.digest(str(f)) == _sha(b"weights")
    assert reads == []


def test_one_row_is_kept_per_file(tmp_path, digests, monkeypatch):
    monkeypatch.setattr(content_digest, "RACY_NS", 0)
    f = tmp_path / "w.bin"
    for data in (b"one", b"two", b"three"):
        f.write_bytes(data)
        assert content_digest.digest(str(f)) == _sha(data)
    with sqlite3.connect(digests) as db:
        assert db.execute("SELECT sha256 FROM digests").fetchall() == [(_sha(b"three"),)]


def test_processes_digesting_at_once_all_succeed(tmp_path, digests):
    files = []
    for i in range(30):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 1000)
        files.append(str(tmp_path / f"f{i}"))
    script = _SECOND_PROCESS.replace("print(content_digest.digest(sys.argv[1]))",
                                     "print(' '.join(content_digest.digest(p) for p in sys.argv[1:]))")
    procs = [subprocess.Popen([sys.executable, "-c", script, *files], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    expected = " ".join(_sha(bytes([i]) * 1000) for i in range(30))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == expected
    with sqlite3.connect(digests) as db:
        assert db.execute("SELECT COUNT(*) FROM digests").fetchone() == (30,)


def test_an_unusable_cache_folder_falls_back_to_reading(tmp_path, monkeypatch, digests, reads):
    monkeypatch.setattr(content_digest, "RACY_NS", 0)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # <file>/overmind cannot be made
    (tmp_path / "w.bin").write_bytes(b"weights")
    assert content_digest.digest(str(tmp_path / "w.bin")) == _sha(b"weights")
    assert content_digest.digest(str(tmp_path / "w.bin")) == _sha(b"weights")
    assert len(reads) == 1  # still remembered by this process


def test_a_corrupt_sqlite_file_falls_back_to_reading(tmp_path, digests, monkeypatch):
    monkeypatch.setattr(content_digest, "RACY_NS", 0)
    os.makedirs(os.path.dirname(digests))
    with open(digests, "wb") as f:
        f.write(b"this is not an sqlite database" * 100)
    (tmp_path / "w.bin").write_bytes(b"weights")
    assert content_digest.digest(str(tmp_path / "w.bin")) == _sha(b"weights")


def test_a_locked_sqlite_file_does_not_fail_the_digest(tmp_path, digests, monkeypatch):
    monkeypatch.setattr(content_digest, "RACY_NS", 0)
    (tmp_path / "a.bin").write_bytes(b"a")
    assert content_digest.digest(str(tmp_path / "a.bin")) == _sha(b"a")  # the file exists, in WAL mode
    holder = sqlite3.connect(digests, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process's long write transaction
    try:
        (tmp_path / "b.bin").write_bytes(b"b")
        assert content_digest.digest(str(tmp_path / "b.bin")) == _sha(b"b")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
