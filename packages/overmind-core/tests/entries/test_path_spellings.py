"""A path's spelling without a server (overmind.entries.path_spellings): which places named by an adapter an entry
records (only values the argument derives: the argument itself, ``str()`` of a ``pathlib`` one, ``os.path.join`` of
it and a tail; never one inside an object the call was given) and what a hit writes there for its own spelling."""
from __future__ import annotations

import os
import pathlib

import pytest

from overmind.adapter import DerivedPath
from overmind.entries import arguments_ref, path_spellings

ARG = "pretrained_model_name_or_path"


class Box:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def _result(spelled: str):
    """What a library derives from ``spelled``, beside strings it does not (the config's model_type "m")."""
    config = Box(_name_or_path=spelled, model_type="m")
    return Box(name_or_path=spelled, config=config,
               init_kwargs={"vocab_file": os.path.join(spelled, "vocab.txt"), "name": spelled,
                            "merges_file": spelled + "/merges.txt"},  # not a join: "/abs/m//merges.txt"
               parts=[Box(folder=os.path.join(spelled, "unet"))])


# the places an adapter names: never model_type, which equals "m" by coincidence (the core cannot tell)
PLACES = [DerivedPath([], "name_or_path", ARG), DerivedPath([("attr", "config")], "_name_or_path", ARG),
          DerivedPath([("attr", "init_kwargs")], "vocab_file", ARG, item=True),
          DerivedPath([("attr", "init_kwargs")], "merges_file", ARG, item=True),
          DerivedPath([("attr", "parts"), ("item", 0)], "folder", ARG)]


@pytest.mark.parametrize("first,then", [("m", "./m"), ("./m", "/abs/m/"), ("/abs/m/", "m")])
def test_a_hit_writes_its_own_spelling_where_the_first_call_derived_one(first, then):
    records = path_spellings.record(_result(first), PLACES, {ARG: first})
    joined_merges = [("merges_file", "joined", "merges.txt")] if not first.endswith("/") else []
    assert [(r["key"], r["as"], r.get("tail")) for r in records] == [
        ("name_or_path", "given", None), ("_name_or_path", "given", None), ("vocab_file", "joined", "vocab.txt"),
        *joined_merges, ("folder", "joined", "unet")]
    hit = _result(first)
    path_spellings.respell(hit, records, {ARG: then})
    assert (hit.name_or_path, hit.config._name_or_path, hit.init_kwargs["vocab_file"], hit.parts[0].folder) == (
        then, then, os.path.join(then, "vocab.txt"), os.path.join(then, "unet"))
    assert (hit.config.model_type, hit.init_kwargs["name"]) == ("m", first)  # not named: untouched


def test_a_pathlib_argument_is_kept_as_given_or_as_its_str():
    first, then = pathlib.Path("m"), pathlib.Path("/abs/m")
    result = Box(given=first, text=str(first), joined="m/unet")
    places = [DerivedPath([], name, ARG) for name in ("given", "text", "joined")]
    records = path_spellings.record(result, places, {ARG: first})
    assert [r["as"] for r in records] == ["given", "str", "joined"]
    path_spellings.respell(result, records, {ARG: then})
    assert (result.given, result.text, result.joined) == (then, "/abs/m", "/abs/m/unet")
    assert result.given is then


def test_a_place_may_lie_past_a_tuple():
    result = (Box(name_or_path="m"), {"missing_keys": []})  # output_loading_info=True
    records = path_spellings.record(result, [DerivedPath([("item", 0)], "name_or_path", ARG)], {ARG: "m"})
    path_spellings.respell(result, records, {ARG: "./m"})
    assert result[0].name_or_path == "./m"


def test_places_inside_an_object_the_call_was_given_are_the_callers_own():
    given = Box(folder="m/unet")
    result = Box(unet=given, own=Box(folder="m/vae"))
    places = [DerivedPath([("attr", "unet")], "folder", ARG), DerivedPath([("attr", "own")], "folder", ARG)]
    records = path_spellings.record(result, places, {ARG: "m", "unet": given})
    assert [r["steps"] for r in records] == [[["attr", "own"]]]


def test_absent_places_and_other_argument_types_are_not_recorded():
    result = Box(config=Box())
    places = [DerivedPath([("attr", "config")], "_name_or_path", ARG), DerivedPath([("attr", "nothing")], "x", ARG),
              DerivedPath([], "config", ARG)]
    assert path_spellings.record(result, places, {ARG: "m"}) == []
    assert path_spellings.record(Box(name="m"), [DerivedPath([], "name", ARG)], {ARG: b"m"}) == []
    with pytest.raises(TypeError, match="return overmind.adapter.DerivedPath records"):
        path_spellings.record(result, [("config", "_name_or_path")], {ARG: "m"})


def test_a_hit_that_cannot_write_its_spelling_refuses():
    records = path_spellings.record(Box(name="m"), [DerivedPath([], "name", ARG)], {ARG: "m"})
    with pytest.raises(arguments_ref.ArgumentMismatch, match="does not pass as a str or pathlib path"):
        path_spellings.respell(Box(name="m"), records, {})
    with pytest.raises(path_spellings.Unplaced):
        path_spellings.respell(object(), records, {ARG: "./m"})


def test_a_step_is_an_attribute_or_an_item():
    with pytest.raises(ValueError, match=r"a step is \('attr', name\) or \('item', key\)"):
        DerivedPath([("getattr", "config")], "_name_or_path", ARG)
