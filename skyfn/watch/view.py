"""How `skyfn task watch` shows a Tally snapshot: a live board (rich) on a terminal, plain
lines when stdout is not one, and the lines shared by both. WAITING (for inputs) has its own
colour, count and column per endpoint, apart from the tasks pending on the endpoint's side
(CREATED, QUEUED, DISPATCHED); the time waited for inputs is shown as its own line.

rich is imported only when a board is drawn: the plain lines and the JSON need nothing.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

from skyfn.watch.tally import BAD, WAITING, Tally, waits_text

COLOURS = {"SUCCEEDED": "green", "FAILED": "red", "TIMED_OUT": "red", "CANCELLED": "yellow",
           "RUNNING": "cyan", "DISPATCHED": "blue", "QUEUED": "magenta", "WAITING": "orange3", "CREATED": "white"}
PENDING = ("CREATED", "QUEUED", "DISPATCHED")  # on their way to a worker (WAITING ones are not yet)


def duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def rate(per_s: float) -> str:
    return f"{per_s:.1f} tasks/s" if per_s < 100 else f"{per_s:,.0f} tasks/s"


def percent(snap: dict[str, Any]) -> int:
    return int(100 * snap["finished"] / snap["total"]) if snap["total"] else 100


def plain_line(snap: dict[str, Any], now: Optional[float] = None) -> str:
    """One progress line, for logs and pipes."""
    clock = time.strftime("%H:%M:%S", time.localtime(time.time() if now is None else now))
    states = ", ".join(f"{s} {n}" for s, n in snap["states"].items() if n)
    waited = waits_text(snap)
    return (f"{clock} {snap['finished']}/{snap['total']} finished ({percent(snap)}%): {states} | "
            f"{rate(snap['throughput'])} | ETA {duration(snap['eta_seconds'])}" + (f" | {waited}" if waited else ""))


def failure_lines(snap: dict[str, Any]) -> list[str]:
    return [f"  {f['state']} {f['task_id']} on {f['endpoint']}: {f['reason']}" for f in snap["failures"]]


def render(snap: dict[str, Any], note: str = ""):
    """The board: progress, counts per state, per endpoint, the wait for inputs, the last failures."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 2))
    for _ in range(5):
        head.add_column()
    head.add_row(ProgressBar(total=max(1, snap["total"]), completed=snap["finished"], width=40),
                 f"{snap['finished']}/{snap['total']} ({percent(snap)}%)", rate(snap["throughput"]),
                 f"ETA {duration(snap['eta_seconds'])}", f"elapsed {duration(snap['elapsed_seconds'])}")

    states = Table(box=None, padding=(0, 1), show_edge=False)
    for s in snap["states"]:
        states.add_column(Text(s, style=COLOURS.get(s, "")), justify="right")
    states.add_row(*[str(n) for n in snap["states"].values()])

    endpoints = Table(box=None, padding=(0, 1), show_edge=False)
    for name in ("endpoint", "tasks", "waiting", "pending", "running", "succeeded", "failed"):
        endpoints.add_column(Text(name, style=COLOURS[WAITING] if name == "waiting" else ""),
                             justify="left" if name == "endpoint" else "right")
    for label, counts in snap["endpoints"].items():
        endpoints.add_row(label, str(sum(counts.values())), str(counts.get(WAITING, 0)),
                          str(sum(counts.get(s, 0) for s in PENDING)), str(counts.get("RUNNING", 0)),
                          str(counts.get("SUCCEEDED", 0)), str(sum(counts.get(s, 0) for s in BAD)))

    parts: list[Any] = [Text(f"skyfn task watch: {snap['total']} tasks{note}", style="bold"), head, Text(""),
                        states, Text(""), endpoints]
    waited = waits_text(snap)
    if waited:
        parts += [Text(""), Text(waited, style=COLOURS[WAITING])]
    if snap["failures"]:
        parts += [Text(""), Text("last failures", style="bold red")]
        parts += [Text(line) for line in failure_lines(snap)]
    return Group(*parts)


class Board:
    """A renderable that reads the Tally each time the live display refreshes."""

    def __init__(self, tally: Tally, note: Callable[[], str] = lambda: "", clock: Callable[[], float] = time.time):
        self.tally = tally
        self.note = note
        self.clock = clock

    def __rich__(self):
        return render(self.tally.snapshot(self.clock()), self.note())
