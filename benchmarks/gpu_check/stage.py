"""What a stage found, as the report shows it: its status, time, commands and output."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any

TAIL_CHARS = 12_000


@dataclass
class Stage:
    name: str
    status: str = "skipped"  # ok, failed, skipped
    seconds: float = 0.0
    detail: str = ""
    commands: list[str] = field(default_factory=list)
    output_tail: str = ""


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    text = text if len(text) <= limit else "[...]\n" + text[-limit:]
    return text.replace("```", "'''")  # keeps the report's code blocks intact


def display(command: list[str]) -> str:
    return shlex.join(["python" if part == sys.executable else part for part in command])


def conclude(stage: Stage, summary: dict[str, Any], problems: list[str], passed: str) -> tuple[Stage, dict[str, Any]]:
    """The stage's verdict from the problems around the ranks, then those in their results."""
    summary["problems"] = problems + summary["problems"]
    stage.status = "failed" if summary["problems"] else "ok"
    stage.detail = "; ".join(summary["problems"][:6]) or passed
    return stage, summary


def time_left_for(
    layout: str, timeout: float, started: float, first_s: float | None, summary: dict[str, Any], runs: int = 1
) -> float:
    """Seconds a stage that began at `started` has left for `layout` (`runs` times the first's work); 0 where
    a layout after the first (which took `first_s`) would not fit, since 2 x 4 takes about twice 2 x 2:
    said in summary["left_out"]."""
    left = timeout - (time.monotonic() - started)
    if first_s is not None and left < 2.2 * runs * first_s:
        summary["left_out"] = f"{layout} left out: {left:.0f} s of the stage left, {first_s:.0f} s for 2x2"
        return 0.0
    return left
