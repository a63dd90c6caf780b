"""Command-line parsing shared by `gpuprov` and `python worker.py`: every usage error is one line,
`error: ...` on stderr with exit code 2, and every numeric flag is bounded where it is parsed."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from gpuprov.models import JOB_NAME_PATTERN
from gpuprov.store.runs import RUN_PATTERN


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): `error: <command>: <what is wrong>`.

    Subcommand parsers are made with the class of their parent, so they share it."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def run_tag(text: str) -> str:
    """An argparse type: a job's run, as its status shows it (six hex digits)."""
    if not re.fullmatch(RUN_PATTERN, text):
        raise argparse.ArgumentTypeError(
            f"not a run (six hex digits, as in `gpuprov status`): {text[:40]!r}"
        )
    return text


def bounded_int(low: int, high: int, unit: str = "") -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`."""
    suffix = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}-{high}{suffix}, got {text[:40]}")
        return value

    return parse


def bounded_float(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from `low` (excluded when `above`) to `high`."""
    lowest = f"above {low:g}" if above else f"at least {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
        if not math.isfinite(value) or value < low or (above and value == low) or value > high:
            raise argparse.ArgumentTypeError(
                f"must be a finite number {lowest} and at most {high:g}, got {text[:40]}"
            )
        return value

    return parse


def bounded_text(limit: int) -> Callable[[str], str]:
    """An argparse type: non-blank text of at most `limit` characters."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("must not be empty")
        if len(text) > limit:
            raise argparse.ArgumentTypeError(f"at most {limit} characters, got {len(text)}")
        return text

    return parse


def job_name(text: str) -> str:
    """An argparse type: a job name (the workflow id is job-<name>)."""
    if not re.fullmatch(JOB_NAME_PATTERN, text):
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} is not a job name (1-40 lowercase letters, digits and '-', "
            "no '-' at either end)"
        )
    return text


_MACHINE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")


def job_or_machine_name(text: str) -> str:
    """An argparse type: a job name or a VM name such as train-7b-a1-n0-ce4389."""
    if not _MACHINE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} is neither a job nor a machine name (lowercase letters, digits "
            "and '-', at most 128)"
        )
    return text
