"""``json.dumps`` and ``json.loads`` through json's own C accelerator (``_json``), without importing ``json`` (which
imports ``re`` and ``enum``): for the wire protocol, the template registry and the environment key of the
``overmind run`` launcher.

The launcher of ``overmind run`` speaks JSON to the template (``ipc/protocol.py``), reads the template registry and
computes the environment key; importing ``json`` imports ``re`` and ``enum`` with it, a quarter of what the launcher
imports (docs/run.md, "How fast"). ``_json`` is the C module ``json`` itself encodes and decodes with, so the text
and the objects are the ones ``json`` gives: :func:`dumps` builds the encoder ``json.dumps`` builds for these
options (``ensure_ascii``, circular-reference check, NaN allowed, no indent), :func:`loads` runs the scanner
``json.loads`` runs and skips the same whitespace around the document.

Where ``_json`` lacks its C functions (another Python implementation), both call ``json`` itself. A document that
is not JSON raises ``json.JSONDecodeError``, as ``json.loads`` does (``json`` is imported for the error only).
"""
from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: the launcher does without importing typing)
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - CPython always builds _json
    _json = None  # type: ignore[assignment]
_make_encoder: Any = getattr(_json, "make_encoder", None)
_make_scanner: Any = getattr(_json, "make_scanner", None)
_encode_str: Any = getattr(_json, "encode_basestring_ascii", None)

_WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE: [ \t\n\r]*


def _not_serializable(obj: Any) -> Any:
    """``json.JSONEncoder.default``: what ``json.dumps`` raises for an object it cannot write."""
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


class _Context:
    """What ``_json.make_scanner`` reads off ``json.JSONDecoder()``: the defaults of ``json.loads``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # only ever given "NaN", "Infinity" or "-Infinity": float() of those is json's value


_scanner = _make_scanner(_Context()) if _make_scanner is not None else None


def dumps(obj: Any, *, sort_keys: bool = False, separators: tuple[str, str] | None = None) -> str:
    """``json.dumps(obj, sort_keys=sort_keys, separators=separators)``."""
    if _make_encoder is None or _encode_str is None:  # pragma: no cover
        import json

        return json.dumps(obj, sort_keys=sort_keys, separators=separators)
    item_separator, key_separator = separators if separators is not None else (", ", ": ")
    if isinstance(obj, str):  # json.JSONEncoder.encode's own shortcut (the encoder writes a str the same way)
        return _encode_str(obj)
    # A new markers dict for each call, as json.JSONEncoder.iterencode makes one (it finds circular references).
    chunks = _make_encoder({}, _not_serializable, _encode_str, None, key_separator, item_separator,
                           bool(sort_keys), False, True)(obj, 0)
    return "".join(chunks)


def loads(text: str) -> Any:
    """``json.loads(text)`` for a ``str``."""
    if _scanner is None:  # pragma: no cover
        import json

        return json.loads(text)
    if not isinstance(text, str):
        raise TypeError(f"the JSON object must be str, not {text.__class__.__name__}")
    if text.startswith("\ufeff"):
        _fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        obj, end = _scanner(text, start)  # (the scanner clears its own memo of keys after each document)
    except StopIteration as err:
        _fail("Expecting value", text, err.value)
    end = len(text) - len(text[end:].lstrip(_WHITESPACE))
    if end != len(text):
        _fail("Extra data", text, end)
    return obj


def _fail(message: str, text: str, position: int) -> None:
    from json import JSONDecodeError

    raise JSONDecodeError(message, text, position) from None
