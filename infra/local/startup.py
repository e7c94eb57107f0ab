"""Start-up timings and readiness signals of the embedded runtime.

`skyfn local up` is a chain of steps, some run in other processes at the same time (moto
and the service start while redis does; the agent starts while the service deploys). Two
things are measured, both with the monotonic clock (CLOCK_MONOTONIC is one clock for every
process on the machine, so the service's timestamps line up with the CLI's):

- the CLI's *phases*, back to back: each is what `up` waited for at that point, so they
  add up to the whole start (`StepTimer.step`);
- the *steps* of the other processes (the service's import, deploy, handler environments),
  reported with their own start and end and shown indented under the phase in which they
  ended (`StepTimer.add`); they overlap the phases and each other, and are not summed.

`skyfn local up --timings` prints the table (`format_table`); the runtime's log
(`$SKYFN_HOME/local/service.log`) gets the service's steps from the service itself and
the CLI's phases in one line (`summary_line`); runtime.json keeps the last start's.

Readiness travels over pipes, never by polling: the service is started with the write end
of a pipe and writes one JSON line when it serves (`report`); the CLI waits on the read end
with select (`wait_report`), and sees the service's exit as end of file.
"""
from __future__ import annotations

import json
import os
import select
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator


def now_ms() -> float:
    """The monotonic clock, in milliseconds (the same clock in every process)."""
    return time.monotonic() * 1000.0


def process_start_ms() -> float:
    """When this process started, on the monotonic clock (ms): its start in clock ticks since
    boot (/proc/self/stat) against the boot-time clock, which counts from the same boot.
    Where there is no /proc: now."""
    try:
        with open("/proc/self/stat") as f:
            started_s = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return now_ms() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started_s) * 1000.0
    except (OSError, ValueError, IndexError, AttributeError):
        return now_ms()


@dataclass
class Step:
    name: str
    start_ms: float  # from the timer's origin
    took_ms: float
    detail: bool = False  # another process's step, overlapping the phases: not part of the sum

    def as_dict(self) -> dict:
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass
class StepTimer:
    """Phases of one start-up, back to back from `origin_ms`, and other processes' steps."""
    origin_ms: float = field(default_factory=now_ms)
    steps: list[Step] = field(default_factory=list)
    _phase_start_ms: float | None = None

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A phase: from the end of the previous one (or the origin) to the end of this block,
        so the phases cover the whole start without gaps."""
        start = self._phase_start_ms if self._phase_start_ms is not None else self.origin_ms
        try:
            yield
        finally:
            end = now_ms()
            self.steps.append(Step(name, start - self.origin_ms, end - start))
            self._phase_start_ms = end

    def add(self, name: str, start_ms: float, end_ms: float) -> None:
        """A step of another process, from its own monotonic timestamps."""
        self.steps.append(Step(name, start_ms - self.origin_ms, end_ms - start_ms, detail=True))

    def add_remote(self, prefix: str, steps: list[dict]) -> None:
        """Steps as `report` sent them ({name, start_ms, end_ms} in absolute monotonic ms)."""
        for s in steps:
            self.add(f"{prefix}{s['name']}", float(s["start_ms"]), float(s["end_ms"]))

    def total_ms(self) -> float:
        phases = [s for s in self.steps if not s.detail]
        return (phases[-1].start_ms + phases[-1].took_ms) if phases else 0.0

    def as_dict(self) -> dict:
        return {"total_ms": round(self.total_ms(), 1), "steps": [s.as_dict() for s in self.steps]}


def format_table(timings: dict) -> str:
    """The table `skyfn local up --timings` prints: the phases (they add up to the total),
    each followed by the other processes' steps that ended during it, indented."""
    steps = [Step(**s) for s in timings["steps"]]
    phases = [s for s in steps if not s.detail]
    details = sorted((s for s in steps if s.detail), key=lambda s: s.start_ms + s.took_ms)
    width = max([len(s.name) + (4 if s.detail else 0) for s in steps] + [len("step")])
    lines = [f"{'step':<{width}}  {'start ms':>9}  {'took ms':>9}"]
    for i, phase in enumerate(phases):
        lines.append(f"{phase.name:<{width}}  {phase.start_ms:9.0f}  {phase.took_ms:9.0f}")
        end = phase.start_ms + phase.took_ms
        last = i == len(phases) - 1
        while details and (last or details[0].start_ms + details[0].took_ms <= end):
            d = details.pop(0)
            lines.append(f"{'    ' + d.name:<{width}}  {d.start_ms:9.0f}  {d.took_ms:9.0f}")
    lines.append(f"{'total':<{width}}  {'':>9}  {timings['total_ms']:9.0f}")
    lines.append("(indented: steps of the other processes, overlapping the phases; the phases add up to the total)")
    return "\n".join(lines)


def summary_line(timings: dict, what: str = "skyfn local up") -> str:
    """One log line: the total and each phase."""
    phases = ", ".join(f"{s['name']} {s['took_ms']:.0f} ms" for s in timings["steps"] if not s["detail"])
    return f"{what} took {timings['total_ms']:.0f} ms: {phases}"


# -- readiness over a pipe -----------------------------------------------------------

class StartFailed(Exception):
    """The process reported a failure, or exited, before it was ready."""


def report(fd: int | None, message: dict) -> None:
    """Write `message` as one JSON line on the pipe `fd` and close it (the other end's
    wait_report returns it). None: nobody waits."""
    if fd is None:
        return
    data = (json.dumps(message) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def wait_report(fd: int, timeout: float) -> dict:
    """The JSON line written on the pipe whose read end is `fd` (then closed). End of file
    (the writer exited, or closed without a word) raises StartFailed; so does a timeout."""
    deadline = time.monotonic() + timeout
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise StartFailed(f"no word within {timeout:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise StartFailed("it exited before it was ready")
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                return json.loads(b"".join(chunks))
    finally:
        os.close(fd)


class StepLog:
    """The steps of one process's start-up, in absolute monotonic ms, for `report` and its log."""

    def __init__(self, log=None):
        self.log = log
        self.steps: list[dict] = []

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = now_ms()
        try:
            yield
        finally:
            self.record(name, start, now_ms())

    def record(self, name: str, start_ms: float, end_ms: float) -> None:
        self.steps.append({"name": name, "start_ms": start_ms, "end_ms": end_ms})
        if self.log is not None:
            self.log.info("start-up step %s: %.0f ms", name, end_ms - start_ms)
