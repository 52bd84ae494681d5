"""One line per bench target, as `make bench` prints them: the metric, ours, the baseline, the
ratio, the target and a verdict that ends the line in `met` or `NOT met`."""

from __future__ import annotations


def verdict(name: str, ours: float, base: float, target: float, at_most: bool = True) -> str:
    ratio = ours / base if base > 0 else float("inf")
    met = ratio <= target if at_most else ratio >= target
    return f"{name:58} {ours:8.2f} {base:8.2f} {ratio:7.2f}x {'<=' if at_most else '>='} {target}x  {'met' if met else 'NOT met'}"
