"""The fleet benchmark's fleet host processes: start, command, SIGKILL and restart them.

A `HostProc` is one `python -m benchmarks.fleet_agents` process (endpoint_agent.fleet with
request counting, benchmarks/fleet_agents.py) running `count` light agents named
`<prefix>-0000`...; its --home keeps their credentials, so a host SIGKILLed and started
again with the same home brings the same endpoints back with no new registration. Its
stdout carries one JSON line per event (ready, stopped, started); its stderr goes to
`<home>/host.log`. `Hosts` holds the fleet's hosts and what is read from them together.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]


class HostError(RuntimeError):
    pass


class HostProc:
    def __init__(self, index: int, count: int, home: Path, service_url: str, token: str, prefix: str,
                 config: dict, threads: int, concurrency: int):
        self.index, self.count, self.home = index, count, Path(home)
        self.prefix = prefix
        self.service_url, self.token = service_url, token
        self.config, self.threads, self.concurrency = config, threads, concurrency
        self.proc: Optional[subprocess.Popen] = None
        self.lines: "queue.Queue[dict]" = queue.Queue()
        self.endpoints: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.starts = 0
        self._log = None

    @property
    def counts_file(self) -> Path:
        return self.home / "counts.json"

    def start(self) -> None:
        """Start the process (again: the same --home, the same endpoints); returns at once."""
        self.home.mkdir(parents=True, exist_ok=True)
        cfg = self.home / "config.yaml"
        cfg.write_text(json.dumps(self.config))  # JSON is YAML
        cmd = [sys.executable, "-m", "benchmarks.fleet_agents", "--counts", str(self.counts_file),
               "--count", str(self.count), "--home", str(self.home), "--prefix", self.prefix,
               "--service", self.service_url, "--token", self.token, "--threads", str(self.threads),
               "--concurrency", str(self.concurrency), "--config", str(cfg)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("SKYFN_ENDPOINT_CREDENTIAL", None)
        self._log = open(self.home / "host.log", "ab")
        self.lines = queue.Queue()
        self.proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, bufsize=1)
        self.starts += 1
        threading.Thread(target=self._read, args=(self.proc, self.lines), name=f"fleet-host-{self.index}",
                         daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen, lines: "queue.Queue[dict]") -> None:
        for line in proc.stdout:
            try:
                lines.put(json.loads(line))
            except ValueError:
                pass
        lines.put({"event": "eof"})

    def wait_event(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HostError(f"fleet host {self.index}: no {event!r} within {timeout:.0f} s; "
                                f"log tail: {self.log_tail()}")
            try:
                msg = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if msg.get("event") == "eof":
                raise HostError(f"fleet host {self.index} exited (code {self.proc.poll()}) waiting for {event!r}; "
                                f"log tail: {self.log_tail()}")
            if msg.get("event") == "error":
                raise HostError(f"fleet host {self.index}: {msg.get('message')}")
            if msg.get("event") == event:
                return msg

    def wait_ready(self, timeout: float) -> dict[str, str]:
        msg = self.wait_event("ready", timeout)
        self.endpoints, self.failed = dict(msg.get("endpoints") or {}), dict(msg.get("failed") or {})
        return self.endpoints

    def command(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (the churn's way)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._close_log()

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def counts(self) -> dict:
        try:
            return json.loads(self.counts_file.read_text())
        except (OSError, ValueError):
            return {}

    def log_tail(self, n: int = 1500) -> str:
        try:
            return (self.home / "host.log").read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"


class Hosts:
    """The fleet's host processes: `sizes` agents each, homes under `root`."""

    def __init__(self, sizes: list[int], root: Path, service_url: str, token: str, config: dict, threads: int,
                 concurrency: int, prefix: str = "fl"):
        self.hosts = [HostProc(i, n, Path(root) / f"host-{i:03d}", service_url, token, f"{prefix}{i:03d}", config,
                               threads, concurrency) for i, n in enumerate(sizes)]

    def start(self, timeout: float) -> dict[str, str]:
        """Start every host, wait until all are ready; name -> endpoint id. Raises HostError
        naming the host and why when one cannot start or some of its agents failed."""
        for h in self.hosts:
            h.start()
        deadline = time.monotonic() + timeout
        for h in self.hosts:
            h.wait_ready(max(1.0, deadline - time.monotonic()))
            if h.failed:
                name, why = next(iter(h.failed.items()))
                raise HostError(f"fleet host {h.index}: {len(h.failed)} agent(s) failed to start, e.g. {name}: {why}")
        return self.endpoint_ids()

    def endpoint_ids(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for h in self.hosts:
            out.update(h.endpoints)
        return out

    def host_of(self, name: str) -> HostProc:
        return next(h for h in self.hosts if name in h.endpoints)

    def pids(self) -> dict[str, int]:
        return {f"host-{h.index}": h.proc.pid for h in self.hosts if h.proc is not None and h.proc.poll() is None}

    def requests(self) -> dict[str, int]:
        """HTTP requests of every host's agents so far, by method and path (summed; a
        restarted host starts counting again: read over windows without restarts)."""
        total: dict[str, int] = {}
        for h in self.hosts:
            for k, v in (h.counts().get("requests") or {}).items():
                total[k] = total.get(k, 0) + v
        return total

    def ready_at(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for h in self.hosts:
            out.update(h.counts().get("ready_at") or {})
        return out

    def stop(self) -> None:
        threads = [threading.Thread(target=h.stop, daemon=True) for h in self.hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
