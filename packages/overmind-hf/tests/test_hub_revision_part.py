"""The Hub revision key part on every supported huggingface_hub: >= 1.0 asks ``HfApi.resolve_revision``; 0.x
(transformers 4.x's) has none, and the cache's refs are read the way the library reads them. Either way a
moved ref gives another key part, and a commit hash names itself."""
from __future__ import annotations

from _support import tiny_models as tm
from overmind_hf import hub


def _snapshot(tmp_path, name, seed):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text('{"seed": %d}' % seed)
    return folder


def test_a_cached_repo_resolves_to_the_commit_its_ref_names_and_follows_a_moved_ref(tmp_path):
    cache = tmp_path / "hub"
    _, rev_a = tm.build_hf_cache(cache, "tiny-org/tiny", _snapshot(tmp_path, "a", 0))
    args = {"cache_dir": str(cache), "local_files_only": True}
    assert hub.revision_part("tiny-org/tiny", dict(args))[:4] == ("hub", "model", "tiny-org/tiny", rev_a)

    _, rev_b = tm.build_hf_cache(cache, "tiny-org/tiny", _snapshot(tmp_path, "b", 1))
    assert rev_b != rev_a
    assert hub.revision_part("tiny-org/tiny", dict(args))[:4] == ("hub", "model", "tiny-org/tiny", rev_b)
    assert hub.revision_part("tiny-org/tiny", dict(args, revision=rev_a))[:4] == ("hub", "model", "tiny-org/tiny", rev_a)


def test_a_snapshot_file_edited_in_place_changes_the_part_and_an_untouched_one_does_not(tmp_path):
    cache = tmp_path / "hub"
    snapshot, rev = tm.build_hf_cache(cache, "tiny-org/tiny", _snapshot(tmp_path, "a", 0))
    args = {"cache_dir": str(cache), "local_files_only": True}
    before = hub.revision_part("tiny-org/tiny", dict(args))
    assert before == hub.revision_part("tiny-org/tiny", dict(args))
    (snapshot / "config.json").write_text('{"seed": 7}')  # through the link into the blob: same revision
    after = hub.revision_part("tiny-org/tiny", dict(args))
    assert after[:4] == before[:4] == ("hub", "model", "tiny-org/tiny", rev) and after[4] != before[4]


def test_a_named_branch_resolves_through_its_own_ref(tmp_path):
    cache = tmp_path / "hub"
    _, rev_main = tm.build_hf_cache(cache, "tiny-org/tiny", _snapshot(tmp_path, "a", 0))
    _, rev_dev = tm.build_hf_cache(cache, "tiny-org/tiny", _snapshot(tmp_path, "b", 1), ref="dev")
    args = {"cache_dir": str(cache), "local_files_only": True}
    assert hub.revision_part("tiny-org/tiny", dict(args, revision="dev"))[3] == rev_dev
    assert hub.revision_part("tiny-org/tiny", dict(args))[3] == rev_main


def test_a_repo_not_in_the_cache_is_unresolved_with_the_reason(tmp_path):
    part = hub.revision_part("tiny-org/absent", {"cache_dir": str(tmp_path), "local_files_only": True})
    assert part[:4] == ("hub", "model", "tiny-org/absent", "unresolved") and part[4] is None and part[5]
