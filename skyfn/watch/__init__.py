"""`skyfn task watch`: a live view of a batch of tasks in the terminal.

selection.py chooses the tasks and reads them once, tally.py counts (states, endpoints,
throughput, ETA, failures), feed.py keeps the counts current (results push, else the
batched long-poll), view.py draws them (a rich board on a terminal, plain lines
otherwise). ``watch()`` ties them together and returns the exit code: 0 when every task
succeeded, 1 when any failed, timed out or was cancelled, 3 with ``once`` when some are
not final yet, 130 when interrupted.
"""
from __future__ import annotations

import json
import sys
import time
from typing import IO, Optional

from skyfn.watch.feed import LONG_POLL_S, Feed, apply
from skyfn.watch.selection import WatchError, check, read_ids, select
from skyfn.watch.tally import Tally, exit_code, summary
from skyfn.watch.view import Board, failure_lines, plain_line, render

__all__ = ["WatchError", "check", "read_ids", "watch"]

PLAIN_EVERY_S = 5.0    # plain mode: a line this often while things change ...
PLAIN_QUIET_S = 60.0   # ... and at least this often when nothing does
INTERRUPTED = 130


def watch(client, ids: list[str], since: Optional[str] = None, endpoint: Optional[str] = None, *,
          once: bool = False, as_json: bool = False, interval: float = 1.0, push: bool = True,
          out: Optional[IO[str]] = None, err: Optional[IO[str]] = None, tty: Optional[bool] = None) -> int:
    """Watch the tasks until every one is final (or one snapshot with ``once``)."""
    out = out or sys.stdout
    err = err or sys.stderr
    check(ids, since, once, as_json)
    tty = out.isatty() if tty is None else tty
    sel = select(client, ids, since, endpoint)
    for note in sel.notes:
        print(f"note: {note}", file=err)
    tally = Tally(sel.endpoints, sel.origin)
    apply(tally, sel.statuses, None)  # already final: when, from the events alone

    if once:
        snap = tally.snapshot(time.time())
        if as_json:
            print(json.dumps(snap, indent=2), file=out)
        else:
            _show(snap, out, tty)
        return exit_code(snap)

    feed = None
    interrupted = False
    try:
        if not tally.done:
            feed = Feed(client, tally, sel.cursor, interval=interval, push=push)
        if tty:
            _live(tally, feed, out, LONG_POLL_S, interval)
        else:
            endpoints = len(set(sel.endpoints.values()))
            print(f"watching {tally.total} task{'s' if tally.total != 1 else ''} on {endpoints} "
                  f"endpoint{'s' if endpoints != 1 else ''} ({_how(feed, interval)})", file=out, flush=True)
            _plain(tally, feed, out)
        if feed is not None:
            feed.settle()  # e.g. how long the last ones waited for their inputs, for the summary
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if feed is not None:
            feed.close()
    snap = tally.snapshot(time.time())
    if not tty:
        lines = failure_lines(snap)
        if lines:
            print("last failures:", file=out)
            print("\n".join(lines), file=out)
    print(("interrupted: " if interrupted else "") + summary(snap), file=out, flush=True)
    return INTERRUPTED if interrupted else exit_code(snap)


def _how(feed: Optional[Feed], interval: float) -> str:
    if feed is None:
        return "all final already"
    return "results pushed" if feed.mode == "push" else f"polling, {interval:g} s apart at least"


def _live(tally: Tally, feed: Optional[Feed], out: IO[str], poll: float, interval: float) -> None:
    from rich.console import Console
    from rich.live import Live

    board = Board(tally, note=lambda: f" ({_how(feed, interval)})")
    with Live(board, console=Console(file=out), refresh_per_second=4, transient=False) as live:
        while not tally.done:
            feed.wait(poll)
        live.refresh()


def _plain(tally: Tally, feed: Optional[Feed], out: IO[str]) -> None:
    shown, printed = None, 0.0
    while True:
        now = time.monotonic()
        snap = tally.snapshot(time.time())
        key = tuple(snap["states"].values())
        if key != shown or now - printed >= PLAIN_QUIET_S:
            print(plain_line(snap), file=out, flush=True)
            shown, printed = key, now
        if snap["done"]:
            return
        due = now + PLAIN_EVERY_S
        while not tally.done and time.monotonic() < due:
            feed.wait(due - time.monotonic())


def _show(snap: dict, out: IO[str], tty: bool) -> None:
    if tty:
        from rich.console import Console

        Console(file=out).print(render(snap))
    else:
        print(plain_line(snap), file=out)
        for line in failure_lines(snap):
            print(line, file=out)
