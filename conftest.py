"""Repository-wide test set-up: tests/ on sys.path (for ``tiny_models``), and no test reaches the Hub."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
