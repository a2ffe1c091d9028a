"""The Hub revision as part of the cache key.

A local folder is fingerprinted by the core (sizes, mtimes, inodes). A Hub id (``"org/name"``) is not a path:
what it loads is decided by the revision it resolves to in the Hugging Face cache (``refs/<branch>`` ->
``snapshots/<commit>/``). The commit goes into the key, so a new snapshot (a new download, or a moved ref in
an offline cache) gives a fresh load instead of a stale entry.

Resolution is huggingface_hub's own (``HfApi.resolve_revision``): from the local cache only when offline
(``HF_HUB_OFFLINE=1``) or with ``local_files_only=True``, otherwise with the one metadata request the library
itself makes on every load.
"""
from __future__ import annotations

import os
import re
from typing import Any

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
    """``("hub", repo_type, repo_id, commit)`` for ``repo_id`` at the revision named in ``arguments``.

    Reads ``revision``, ``cache_dir``, ``local_files_only`` and ``token`` from ``arguments``. When the revision
    cannot be resolved (not in the cache and the Hub unreachable), the part says so; the plain loader will then
    fail or fall back the same way, and a later load that can resolve gets its own entry.
    """
    revision = arguments.get("revision")
    resolved = getattr(revision, "resolved", None)  # already a huggingface_hub.ResolvedRevision
    if resolved:
        return ("hub", repo_type, repo_id, str(resolved))
    try:
        from huggingface_hub import HfApi

        rev = HfApi().resolve_revision(
            repo_id, repo_type=repo_type, revision=revision, cache_dir=arguments.get("cache_dir"),
            local_files_only=bool(arguments.get("local_files_only")) or _offline(), token=arguments.get("token"),
        )
        return ("hub", repo_type, repo_id, str(rev.resolved))
    except Exception as e:  # huggingface_hub raises a different error for each way of failing; all mean "unknown"
        return ("hub", repo_type, repo_id, "unresolved", None if revision is None else str(revision), type(e).__name__)


def key_for_resolved_revision(value: Any) -> Any:
    """A key stand-in for ``huggingface_hub.ResolvedRevision`` (a ``str`` subclass libraries pass down to the
    loads they make inside theirs), or ``None`` for anything else."""
    resolved = getattr(value, "resolved", None)
    if isinstance(value, str) and isinstance(resolved, str):
        return ("resolved-revision", str.__str__(value), resolved)
    return None
