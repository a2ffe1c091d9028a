"""An adapter broken on purpose, the way OVERMIND_FIXTURE_BREAK says (to test the skip-with-one-warning paths):

- ``1``: it fails to import;
- ``wrapper``: it declares a hook with ``hookwrapper=True``, which Overmind refuses when it discovers the adapter;
- ``argument``: its hook takes an argument the hook's spec does not have, which pluggy refuses when the plugin
  manager is made (at the first hook call, not at ``activate()``).
"""
import os

from overmind.adapter import hookimpl

_BREAK = os.environ.get("OVERMIND_FIXTURE_BREAK")

if _BREAK == "1":
    raise ImportError("fixture adapter broken on purpose (OVERMIND_FIXTURE_BREAK=1)")

if _BREAK == "wrapper":
    @hookimpl(hookwrapper=True)
    def overmind_key_parts(loader, arguments):
        yield

if _BREAK == "argument":
    @hookimpl
    def overmind_key_parts(loader, arguments, no_such_argument):
        return None
