"""The Hub revision, and the files of its snapshot, as part of the cache key.

A local folder is fingerprinted by the core (sizes, mtimes, ctimes, inodes). A Hub id (``"org/name"``) is not a
path: what it loads is decided by the revision it resolves to in the Hugging Face cache (``refs/<branch>`` ->
``snapshots/<commit>/``). The commit goes into the key, so a new snapshot (a new download, or a moved ref in
an offline cache) gives a fresh load instead of a stale entry; and the snapshot folder is fingerprinted as a
local folder is, every file in it (the links followed to their blobs), so a file edited in place under the same
revision (``config.json``, ``tokenizer_config.json``, a processor's or a pipeline's ``model_index.json``, custom
code) is a miss too. The whole folder, not the files one load happens to read: a tokenizer's Rust code reads
``tokenizer.json`` where no Python hook sees it, and a folder's fingerprint is a stat per file.

Resolution is huggingface_hub's own (``HfApi.resolve_revision``): from the local cache only when offline
(``HF_HUB_OFFLINE=1``) or with ``local_files_only=True``, otherwise with the one metadata request the library
itself makes on every load. huggingface_hub before 1.0 (what transformers 4.x needs) has no
``resolve_revision``: there the cache's ``refs/<revision>`` file is read as the library itself reads it, and
online the repository's commit is asked with ``HfApi.repo_info``. A lookup that fails online (the Hub
unreachable: the libraries then load from the cache) is answered from the cache too, so a moved ref never
serves the old snapshot's entry.
"""
from __future__ import annotations

import os
import re

from overmind.adapter import fingerprint, raise_users

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The packages the libraries import a model's own code into, fetched with it from the Hub (trust_remote_code).
DYNAMIC_MODULE_PREFIXES = ("transformers_modules", "diffusers_modules")

# A repo id is "name" or "org/name" of word characters, dots and dashes; anything else is not a Hub id.
_REPO_ID = re.compile(r"^[\w.\-]+(/[\w.\-]+)?$")


def looks_like_repo_id(value: Any) -> bool:
    """Whether ``value`` names a Hub repository rather than a local path that exists."""
    if not isinstance(value, str) or not _REPO_ID.match(value) or value in (".", ".."):
        return False
    return not os.path.exists(value)


def _offline() -> bool:
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except (ImportError, AttributeError):
        return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def revision_part(repo_id: str, arguments: dict[str, Any], repo_type: str = "model") -> tuple:
    """``("hub", repo_type, repo_id, commit, files)`` for ``repo_id`` at the revision named in ``arguments``;
    ``files`` is the fingerprint of the commit's snapshot folder in the cache (``None`` where there is none).

    Reads ``revision``, ``cache_dir``, ``local_files_only`` and ``token`` from ``arguments``. When the revision
    cannot be resolved (not in the cache and the Hub unreachable), the part says so; the plain loader will then
    fail or fall back the same way, and a later load that can resolve gets its own entry.
    """
    revision = arguments.get("revision")
    cache_dir, token = arguments.get("cache_dir"), arguments.get("token")
    resolved = getattr(revision, "resolved", None)  # already a huggingface_hub.ResolvedRevision
    if resolved:
        return ("hub", repo_type, repo_id, str(resolved), snapshot_files(repo_id, repo_type, str(resolved), cache_dir))
    local = bool(arguments.get("local_files_only")) or _offline()
    try:
        try:
            commit = _resolve(repo_id, repo_type, revision, cache_dir, local, token)
        except Exception as exc:
            raise_users(exc)
            if local:
                raise
            commit = _resolve(repo_id, repo_type, revision, cache_dir, True, token)
    except Exception as e:  # huggingface_hub raises a different error for each way of failing; all mean "unknown"
        raise_users(e)
        return ("hub", repo_type, repo_id, "unresolved", None if revision is None else str(revision), type(e).__name__)
    return ("hub", repo_type, repo_id, commit, snapshot_files(repo_id, repo_type, commit, cache_dir))


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _repo_folder(repo_id: str, repo_type: str, cache_dir: Any) -> str:
    """``<cache>/models--org--name``, as huggingface_hub lays the cache out (``HF_HUB_CACHE`` by default)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return os.path.join(str(cache_dir or constants.HF_HUB_CACHE), repo_folder_name(repo_id=repo_id,
                                                                                    repo_type=repo_type))


def snapshot_files(repo_id: str, repo_type: str, commit: str, cache_dir: Any) -> tuple | None:
    """The fingerprint of the snapshot folder of ``commit`` in the cache, or ``None`` where it is not there (a
    first download: the load that downloads it is keyed by what was there before)."""
    folder = os.path.join(_repo_folder(repo_id, repo_type, cache_dir), "snapshots", commit)
    try:
        return fingerprint(folder)
    except FileNotFoundError:
        return None


def _resolve(repo_id: str, repo_type: str, revision: Any, cache_dir: Any, local: bool, token: Any) -> str:
    """The commit ``revision`` of ``repo_id`` resolves to (from the cache only when ``local``); raises if unknown."""
    from huggingface_hub import HfApi

    api = HfApi()
    if hasattr(api, "resolve_revision"):  # huggingface_hub >= 1.0
        return str(api.resolve_revision(repo_id, repo_type=repo_type, revision=revision, cache_dir=cache_dir,
                                        local_files_only=local, token=token).resolved)
    if not local:
        return str(api.repo_info(repo_id, repo_type=repo_type, revision=revision, token=token).sha)
    revision = "main" if revision is None else str(revision)
    repo = _repo_folder(repo_id, repo_type, cache_dir)
    if _COMMIT.match(revision) and os.path.isdir(os.path.join(repo, "snapshots", revision)):
        return revision
    with open(os.path.join(repo, "refs", revision), encoding="utf-8") as f:  # what hf_hub_download reads offline
        return f.read().strip()


def key_for_resolved_revision(value: Any) -> Any:
    """A key stand-in for ``huggingface_hub.ResolvedRevision`` (a ``str`` subclass libraries pass down to the
    loads they make inside theirs), or ``None`` for anything else."""
    resolved = getattr(value, "resolved", None)
    if isinstance(value, str) and isinstance(resolved, str):
        return ("resolved-revision", str.__str__(value), resolved)
    return None
