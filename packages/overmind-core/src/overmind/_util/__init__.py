"""Helpers that know nothing of caching: interrupts, the user's frame, frozen records, a lazy logger, the garbage
collector, the C heap, installed distributions, human-readable sizes.
"""
