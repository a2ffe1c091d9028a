"""Tables from samples: min / median / max and n per measure and mode, and ratios taken pair by pair.

A *sample* is one process's report (a dict). A *measure* is a path into it, e.g. ``times.from_pretrained``.
Ratios pair the i-th plain sample with the i-th Overmind sample of the same repetition, so a slow moment
of the machine slows both members of a pair and cancels out of their ratio.
"""
from __future__ import annotations

import statistics
from typing import Iterable


def get(sample: dict, path: str):
    """``sample["a"]["b"]`` for ``path == "a.b"``; None where absent."""
    cur = sample
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def summary(values: Iterable[float]) -> tuple[int, float, float, float] | None:
    """``(n, min, median, max)`` of the numbers among ``values``; None if there are none."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    return len(xs), min(xs), statistics.median(xs), max(xs)


def fmt(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x:.3f}" if x < 10 else f"{x:.2f}"
    if unit == "GiB":
        return f"{x / 2**30:.2f}"
    if unit == "x":
        return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"
    if unit == "GB/s":
        return f"{x:.2f}"
    if unit == "ms":
        return f"{x:.1f}"
    if unit == "n":
        return f"{x:.0f}"
    if unit == "MiB":
        return f"{x / 2**20:.0f}"
    return f"{x:g}"


def table(groups: dict[str, list[dict]], measures: list[tuple[str, str, str]]) -> str:
    """A markdown table: one row per (measure, mode) with n, min, median, max.

    ``groups`` maps a mode label (``plain``, ``cold``, ``warm``) to its samples; ``measures`` lists
    ``(path, title, unit)``.
    """
    rows = ["| measure | mode | n | min | median | max |", "|---|---|---:|---:|---:|---:|"]
    for path, title, unit in measures:
        for mode, samples in groups.items():
            s = summary(get(x, path) for x in samples)
            if s is None:
                continue
            n, lo, med, hi = s
            rows.append(f"| {title} ({unit}) | {mode} | {n} | {fmt(lo, unit)} | {fmt(med, unit)} | {fmt(hi, unit)} |")
    return "\n".join(rows)


def pair_ratios(num: list[dict], den: list[dict], path: str) -> list[float]:
    """``num[i][path] / den[i][path]`` for each pair where both exist and the denominator is not zero."""
    out = []
    for a, b in zip(num, den):
        x, y = get(a, path), get(b, path)
        if x is not None and y:
            out.append(x / y)
    return out


def ratio_table(rows: list[tuple[str, list[float]]]) -> str:
    """A markdown table of pairwise ratios: ``rows`` is ``[(title, ratios)]``."""
    lines = ["| ratio (pair by pair) | n | min | median | max |", "|---|---:|---:|---:|---:|"]
    for title, ratios in rows:
        s = summary(ratios)
        if s is None:
            continue
        n, lo, med, hi = s
        lines.append(f"| {title} | {n} | {fmt(lo, 'x')} | {fmt(med, 'x')} | {fmt(hi, 'x')} |")
    return "\n".join(lines)


def machine_line(m: dict) -> str:
    """One line naming the machine and versions, for under a table."""
    return (f"Machine: {m['nproc']} cores ({m['cpu']}), {m['mem_gib']} GiB RAM, load average at start "
            f"{m['load_avg'][0]:.1f}; Python {m['python']}, torch {m['torch']}, diffusers {m['diffusers']}, "
            f"transformers {m['transformers']}, safetensors {m['safetensors']}, bitsandbytes {m['bitsandbytes']}, "
            f"stable-fast {m['stable-fast']}, overmind-core {m['overmind-core']} (tree {m.get('commit', '-')}). "
            f"Date: {m['date']}.")
