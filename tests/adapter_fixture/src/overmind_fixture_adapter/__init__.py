"""A tiny library and its Overmind adapter, installed by scripts/setup for the discovery tests."""
