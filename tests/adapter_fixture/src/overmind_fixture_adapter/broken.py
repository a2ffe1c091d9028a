"""An adapter that fails to import when OVERMIND_FIXTURE_BREAK=1 (to test the skip-with-one-warning path)."""
import os

if os.environ.get("OVERMIND_FIXTURE_BREAK") == "1":
    raise ImportError("fixture adapter broken on purpose (OVERMIND_FIXTURE_BREAK=1)")
