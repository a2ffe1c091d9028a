"""Repository-wide test set-up: no test reaches the Hub. (Shared helpers live in tests/_support, importable
through pytest's ``pythonpath`` option in pyproject.toml.)"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
