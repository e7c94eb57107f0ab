"""Real NATs on one machine, made of Linux network namespaces (tests and benchmarks).

Topology of one ``NatTopology(n)``::

    peer i ns               router i ns                          public ns
    eth0 192.168.7.2/24 --- priv 192.168.7.1/24
                            pub  198.51.100.(10+i)/24  --- ri --- br0 198.51.100.1/24

- The public namespace is "the internet": a bridge joining every router's public side;
  its own address (``PUBLIC_IP``) is where servers (the rendezvous, Redis) listen.
- Each router namespace is the only one with ``ip_forward=1``. It source-NATs its peer
  (iptables MASQUERADE on ``pub``; ``--random-fully`` when symmetric, which picks a new
  random port per destination, so hole punching cannot work) and silently drops every
  unsolicited inbound packet (no reset), as consumer routers do.
- Every peer has the same private address, so peers can only reach each other through
  the NATs, at the public address and port their router gave them.

Names carry this process's pid and a counter, so parallel runs never collide; namespaces
left by a dead run are removed the next time a topology is made. ``close()`` ends the
processes started in the topology and deletes every namespace (the veths and the bridge
go with them); it runs on ``with`` exit, on a failed setup, and at interpreter exit.

Processes run inside a namespace with ``ip netns exec NS argv...`` (``spawn``/``run``;
``python()`` runs this interpreter with the repository on ``PYTHONPATH``).
"""
from __future__ import annotations

import atexit
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from endpoint_agent.procutil import pid_alive

PUBLIC_IP = "198.51.100.1"
PUBLIC_PREFIX = "198.51.100."
PRIVATE_ROUTER_IP = "192.168.7.1"
PRIVATE_PEER_IP = "192.168.7.2"
REPO_ROOT = Path(__file__).resolve().parents[2]

_NAME_RE = re.compile(r"^skyfn(\d+)x(\d+)-")
_counter = itertools.count()
_live: list["NatTopology"] = []


class NamespaceUnavailable(RuntimeError):
    """Network namespaces cannot be created here (not root, or no ip/iptables)."""


def _sh(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def namespaces_unavailable_reason() -> str | None:
    """Why namespaces with NAT cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces with NAT need root (run the tests as root)"
    for tool in ("ip", "iptables"):
        if _sh(["sh", "-c", f"command -v {tool}"], check=False).returncode != 0:
            return f"`{tool}` is not installed (run scripts/install-system.sh)"
    name = f"skyfn{os.getpid()}x{next(_counter)}-probe"
    try:
        if _sh(["ip", "netns", "add", name], check=False).returncode != 0:
            return "`ip netns add` fails here (no permission to create network namespaces)"
        probe = _sh(["ip", "netns", "exec", name, "iptables", "-t", "nat", "-A", "POSTROUTING",
                     "-o", "lo", "-j", "MASQUERADE", "--random-fully"], check=False)
        if probe.returncode != 0:
            return f"iptables NAT does not work in a namespace: {probe.stderr.strip()}"
    finally:
        _sh(["ip", "netns", "del", name], check=False)
    return None


def _kill_namespace(name: str) -> None:
    """Kill what still runs in namespace `name` (only ever one of ours), then delete it."""
    pids = _sh(["ip", "netns", "pids", name], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _sh(["ip", "netns", "del", name], check=False)


def sweep_stale() -> list[str]:
    """Delete namespaces left by topology runs whose process is gone; returns their names."""
    removed = []
    for line in _sh(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NAME_RE.match(name)
        if m and not pid_alive(int(m.group(1))):
            _kill_namespace(name)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class Site:
    """One NATed peer: its namespace, its router's namespace and addresses."""
    index: int
    ns: str
    router_ns: str
    public_ip: str           # the router's public address (what the world sees)
    private_ip: str = PRIVATE_PEER_IP
    symmetric: bool = False


class NatTopology:
    """``n`` peers, each behind its own NAT router, and a public namespace."""

    def __init__(self, n: int = 2, symmetric: bool | Sequence[bool] = False):
        if n < 1 or n > 200:
            raise ValueError(f"n must be between 1 and 200 peers, got {n}")
        flags = [symmetric] * n if isinstance(symmetric, bool) else list(symmetric)
        if len(flags) != n:
            raise ValueError(f"symmetric needs one flag per peer ({n}), got {len(flags)}")
        self.run_id = f"skyfn{os.getpid()}x{next(_counter)}"
        self.public_ns = f"{self.run_id}-pub"
        self.public_ip = PUBLIC_IP
        self.sites = [Site(i, f"{self.run_id}-p{i}", f"{self.run_id}-r{i}", f"{PUBLIC_PREFIX}{10 + i}", symmetric=flags[i])
                      for i in range(n)]
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> "NatTopology":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self) -> "NatTopology":
        reason = namespaces_unavailable_reason()
        if reason:
            raise NamespaceUnavailable(reason)
        sweep_stale()
        _live.append(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _sh(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _sh(["ip", "-n", name, "link", "set", "lo", "up"])
        # New namespaces may inherit ip_forward=1 from the host: only routers forward.
        self.sysctl(name, "net.ipv4.ip_forward", "0")

    def _build(self) -> None:
        pub = self.public_ns
        self._add_ns(pub)
        _sh(["ip", "-n", pub, "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "-n", pub, "addr", "add", f"{PUBLIC_IP}/24", "dev", "br0"])
        _sh(["ip", "-n", pub, "link", "set", "br0", "up"])
        for s in self.sites:
            self._add_ns(s.router_ns)
            self._add_ns(s.ns)
            r, p = s.router_ns, s.ns
            # public side: router "pub" <-> "r<i>" on the public bridge
            _sh(["ip", "-n", pub, "link", "add", f"r{s.index}", "type", "veth", "peer", "name", "pub", "netns", r])
            _sh(["ip", "-n", pub, "link", "set", f"r{s.index}", "master", "br0", "up"])
            _sh(["ip", "-n", r, "addr", "add", f"{s.public_ip}/24", "dev", "pub"])
            _sh(["ip", "-n", r, "link", "set", "pub", "up"])
            # private side: router "priv" <-> peer "eth0"
            _sh(["ip", "-n", r, "link", "add", "priv", "type", "veth", "peer", "name", "eth0", "netns", p])
            _sh(["ip", "-n", r, "addr", "add", f"{PRIVATE_ROUTER_IP}/24", "dev", "priv"])
            _sh(["ip", "-n", r, "link", "set", "priv", "up"])
            _sh(["ip", "-n", p, "addr", "add", f"{s.private_ip}/24", "dev", "eth0"])
            _sh(["ip", "-n", p, "link", "set", "eth0", "up"])
            _sh(["ip", "-n", p, "route", "add", "default", "via", PRIVATE_ROUTER_IP])
            self.sysctl(r, "net.ipv4.ip_forward", "1")
            self._nat_rules(s)

    def _nat_rules(self, s: Site) -> None:
        ipt = ["ip", "netns", "exec", s.router_ns, "iptables"]
        masq = ["-t", "nat", "-A", "POSTROUTING", "-o", "pub", "-j", "MASQUERADE"]
        _sh(ipt + masq + (["--random-fully"] if s.symmetric else []))
        # Forward out freely; let in only replies to connections the inside opened
        # (and ports explicitly forwarded, see forward_port). Everything else is dropped
        # without a reset, to the router itself as well.
        _sh(ipt + ["-P", "FORWARD", "DROP"])
        # Packets conntrack cannot place (e.g. mid-stream after the mapping expired) are
        # dropped, never forwarded un-NATed with their private source address.
        _sh(ipt + ["-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"])
        _sh(ipt + ["-A", "FORWARD", "-i", "priv", "-o", "pub", "-j", "ACCEPT"])
        _sh(ipt + ["-A", "FORWARD", "-i", "pub", "-o", "priv", "-m", "conntrack",
                   "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"])
        _sh(ipt + ["-A", "INPUT", "-i", "pub", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"])
        _sh(ipt + ["-A", "INPUT", "-i", "pub", "-j", "DROP"])

    def close(self) -> None:
        """End every process started here, then delete the namespaces. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for name in reversed(self._namespaces):
            _kill_namespace(name)
        self._namespaces.clear()
        if self in _live:
            _live.remove(self)

    # -- running things inside ----------------------------------------------------------

    @staticmethod
    def sysctl(ns: str, key: str, value: str) -> None:
        _sh(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}"])

    @staticmethod
    def _env(extra: dict | None) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def spawn(self, ns: str, argv: Sequence[str], env: dict | None = None, **popen_kw) -> subprocess.Popen:
        """Start `argv` inside namespace `ns`; it is killed by close() if still running."""
        if ns not in self._namespaces:
            raise ValueError(f"{ns!r} is not a namespace of this topology ({self.run_id})")
        popen_kw.setdefault("cwd", str(REPO_ROOT))
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=self._env(env), **popen_kw)
        self._procs.append(proc)
        return proc

    def python(self, ns: str, args: Sequence[str], env: dict | None = None, **popen_kw) -> subprocess.Popen:
        """Start this Python interpreter (the venv's) with `args` inside namespace `ns`."""
        return self.spawn(ns, [sys.executable, *args], env=env, **popen_kw)

    def run(self, ns: str, argv: Sequence[str], timeout: float = 60.0, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run `argv` to completion inside `ns`, capturing text output."""
        proc = self.spawn(ns, argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise RuntimeError(f"`{' '.join(argv)}` in {ns} did not finish within {timeout} s:\n{err}") from None
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` in {ns} failed ({proc.returncode}):\n{err or out}")
        return done

    def forward_port(self, site: Site, port: int, proto: str = "tcp") -> None:
        """Port-forward `port` on `site`'s router public address to the peer behind it
        (DNAT), the way a user opens a port on a home router. Used by benchmarks to run
        plain tools (iperf3, a C ping-pong) over the same NAT path as punched channels."""
        ipt = ["ip", "netns", "exec", site.router_ns, "iptables"]
        _sh(ipt + ["-t", "nat", "-A", "PREROUTING", "-i", "pub", "-p", proto, "--dport", str(port),
                   "-j", "DNAT", "--to-destination", f"{site.private_ip}:{port}"])
        _sh(ipt + ["-I", "FORWARD", "1", "-i", "pub", "-o", "priv", "-p", proto, "-d", site.private_ip,
                   "--dport", str(port), "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"])

    def set_idle_timeout(self, site: Site, seconds: int) -> None:
        """Make `site`'s router forget an idle TCP mapping after `seconds` (consumer
        routers do this after minutes), strictly: a packet of a forgotten connection is
        not picked up again (nf_conntrack_tcp_loose=0) but dropped, so only traffic at
        least every `seconds` (keep-alives) keeps a connection through this NAT alive."""
        self.sysctl(site.router_ns, "net.netfilter.nf_conntrack_tcp_timeout_established", str(int(seconds)))
        self.sysctl(site.router_ns, "net.netfilter.nf_conntrack_tcp_loose", "0")

    def conntrack(self, site: Site) -> str:
        """The router's connection-tracking table (what its NAT did), for diagnostics."""
        return _sh(["ip", "netns", "exec", site.router_ns, "conntrack", "-L"], check=False).stdout

    def namespaces(self) -> list[str]:
        return list(self._namespaces)


def wait_listening(topo: NatTopology, ns: str, port: int, timeout: float = 15.0,
                   proc: subprocess.Popen | None = None) -> None:
    """Wait until something in `ns` listens on TCP `port` (checked with `ss`, no traffic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with code {proc.returncode} before listening on {port}")
        out = _sh(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"], check=False).stdout
        if out.strip():
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} in {ns} after {timeout} s")


@atexit.register
def _close_all() -> None:
    for topo in list(_live):
        topo.close()
