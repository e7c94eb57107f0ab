"""Communicator groups inside a NatTopology (tests and benchmarks): the rendezvous server
in the public namespace, and rank programs in the peer namespaces whose JSON-line output
is read with a timeout."""
from __future__ import annotations

import json
import queue
import subprocess
import threading
from typing import Sequence

from tests.comm.netns import NatTopology, wait_listening

SECRET_ENV = "SKYFN_RENDEZVOUS_SECRET"


def start_rendezvous(topo: NatTopology, secret: str, port: int = 7300, join_timeout_s: float = 60.0,
                     log_level: str = "warning") -> subprocess.Popen:
    """`python -m rendezvous` on the public address (secret by environment, not argv)."""
    proc = topo.python(topo.public_ns, ["-m", "rendezvous", "--host", topo.public_ip, "--port", str(port),
                                        "--join-timeout", str(join_timeout_s), "--log-level", log_level],
                       env={SECRET_ENV: secret}, stdin=subprocess.DEVNULL)
    wait_listening(topo, topo.public_ns, port, proc=proc)
    return proc


class LineReader:
    """Reads a child's stdout lines in a thread, so the caller can wait with a timeout."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def json(self, timeout: float) -> dict:
        """The next JSON line (other output is kept in .seen); raises with what was seen."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no JSON line from {self.proc.args} within {timeout} s; saw {self.seen[-5:]}")
            if line is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"{self.proc.args} ended (code {self.proc.wait()}) without a JSON line; "
                                   f"saw {self.seen[-5:]}; stderr: {err[-3000:]}")
            self.seen.append(line)
            if line.startswith("{"):
                return json.loads(line)


def spawn_ranks(topo: NatTopology, sites, module: str, args_for: "callable", env: dict) -> list[LineReader]:
    """Start `python -m module *args_for(site)` in each site's namespace, pipes attached."""
    readers = []
    for s in sites:
        proc = topo.python(s.ns, ["-m", module, *map(str, args_for(s))], env=env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        readers.append(LineReader(proc))
    return readers


def tell_all(readers: Sequence[LineReader], line: str = "go") -> None:
    for r in readers:
        r.proc.stdin.write(line + "\n")
        r.proc.stdin.flush()
