"""argparse types shared by every command (infra's and jobs'): a bad value is one sentence naming
what would do, which argparse prefixes with the flag."""

from __future__ import annotations

import argparse


def whole_number(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; use {minimum} or more") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; use {minimum} or more")
    return value


def positive_int(text: str) -> int:
    return whole_number(text, 1)


def non_negative_int(text: str) -> int:
    return whole_number(text, 0)


def positive_number(text: str, unit: str = "") -> float:
    what = f"a positive number of {unit}" if unit else "a positive number"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; use {what}") from None
    if not 0 < value < float("inf"):  # also rejects nan
        raise argparse.ArgumentTypeError(f"{text} is not allowed; use {what}")
    return value


def positive_seconds(text: str) -> float:
    return positive_number(text, "seconds")


def non_negative_seconds(text: str) -> float:
    """0 or a positive number of seconds."""
    try:
        if float(text) == 0:
            return 0.0
    except ValueError:
        pass
    return positive_number(text, "seconds (or 0)")
