"""A real single-node Slurm cluster for the provider tests, started and stopped by the tests.

Everything lives in one private directory: slurm.conf, a fresh munge key, munged's
socket, Slurm's state and spool directories, pid and log files. The daemons (munged,
slurmctld, slurmd) run in the foreground as children of the test process and are
stopped by their PIDs afterwards; nothing in /etc or /run is touched, and the ports are
chosen free, so a system Slurm (if any) is left alone. Clients find the cluster through
the SLURM_CONF environment variable (`SlurmCluster.env()`), which the `slurm_cluster`
fixture sets for the test session.

Needs the Debian packages slurmctld, slurmd, slurm-client and munge
(scripts/install-system.sh installs them) and root (slurmd starts jobs as their user).
The fixture skips, with the reason, when a binary is missing or when not root.

    python -m tests.agent.slurm_cluster DIR   # start one by hand; Ctrl-C stops it
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol", "srun")


def _find(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin", "/usr/local/sbin") if (p := Path(d) / name).exists()), None)


def missing_reason() -> str | None:
    """Why a cluster cannot be started here, or None."""
    missing = [b for b in BINARIES if _find(b) is None]
    if missing:
        return (f"Slurm/munge binaries not found: {', '.join(missing)} "
                "(install with `bash scripts/install-system.sh`: slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        return "a private Slurm cluster needs root (slurmd starts jobs as their owner); run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _own_session_die_with_parent() -> None:
    """In the child before exec: its own session (a Ctrl-C of the tests does not reach it
    first) and SIGTERM when the test process dies, so a killed test run leaves no daemons."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class SlurmError(RuntimeError):
    pass


class SlurmCluster:
    def __init__(self, root: Path, *, cpus: int | None = None, cluster_name: str = "skyfntest"):
        self.root = Path(root)
        self.cpus = cpus or _cpus()
        self.cluster_name = cluster_name
        self.hostname = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ctld_port = _free_port()
        self.slurmd_port = _free_port()

    # --- files ---------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Variables a client (sbatch, squeue, ...) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def write_files(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)  # clients need to reach the socket; the key stays 0600
        key = r / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        self.conf.write_text(f"""\
# written by tests/agent/slurm_cluster.py: a private single-node cluster for tests
ClusterName={self.cluster_name}
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=2
MinJobAge=300
MessageTimeout=10
NodeName={self.hostname} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.hostname} Default=YES MaxTime=INFINITE State=UP
""")

    # --- processes -------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        env = {**os.environ, **self.env()}
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            env=env, preexec_fn=_own_session_die_with_parent)
        out.close()

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise SlurmError(f"{name} exited with code {p.returncode} during start-up:\n{self.logs(name)}")

    def logs(self, name: str | None = None, tail: int = 40) -> str:
        files = sorted((self.root / "log").glob(f"{name}*" if name else "*"))
        parts = []
        for f in files:
            lines = f.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def run(self, *argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **self.env()})
        if check and p.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()}")
        return p

    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        self.write_files()
        r = self.root
        self._spawn("munged", [_find("munged"), "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={r}/munge/munge.key", f"--pid-file={r}/munge/munged.pid",
                               f"--seed-file={r}/munge/munged.seed", f"--log-file={r}/log/munged.log"])
        deadline = time.monotonic() + 15
        while not self.munge_socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmError(f"munged did not create {self.munge_socket}:\n{self.logs()}")
            time.sleep(0.05)
        self._spawn("slurmctld", [_find("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_find("slurmd"), "-D", "-f", str(self.conf), "-N", self.hostname])
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            self._check_alive()
            p = self.run(_find("sinfo"), "-h", "-N", "-o", "%N %T", timeout=10, check=False)
            state = p.stdout.strip() or p.stderr.strip()
            if p.returncode == 0 and any(line.split()[1:2] == ["idle"] for line in p.stdout.splitlines()):
                return self
            if p.returncode == 0 and any(s in state for s in ("drain", "down")):
                # e.g. a registration mismatch: clear it once the node has registered
                self.run(_find("scontrol"), "update", f"nodename={self.hostname}", "state=resume", check=False)
            time.sleep(0.3)
        raise SlurmError(f"the node did not become idle within {timeout:.0f} s (sinfo: {state!r}):\n{self.logs()}")

    def stop(self) -> None:
        # slurmd first (it ends the jobs' steps), then the controller, then munged
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self._kill_leftover_jobs()

    def _kill_leftover_jobs(self) -> None:
        """Job processes (slurmstepd and its children) are not our children: find those whose
        environment names our SLURM_CONF and end them, so nothing outlives the tests."""
        mine = f"SLURM_CONF={self.conf}".encode()
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
                continue
            try:
                environ = (pid_dir / "environ").read_bytes()
                cmd = (pid_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if mine in environ.split(b"\0") or (b"slurmstepd" in cmd and str(self.root).encode() in environ):
                try:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
                except OSError:
                    pass

    def __enter__(self) -> "SlurmCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


try:
    import pytest
except ImportError:  # pragma: no cover - used as a script without pytest
    pytest = None

_shared: dict = {"cluster": None, "users": 0, "old_conf": None}

if pytest is not None:
    @pytest.fixture(scope="session")
    def slurm_cluster(tmp_path_factory):
        """A running private Slurm cluster; SLURM_CONF points at it while it runs. Test modules
        import this fixture; they share one cluster per session (reference-counted)."""
        reason = missing_reason()
        if reason:
            pytest.skip(reason)
        if _shared["cluster"] is None:
            cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
            try:
                cluster.start()
            except BaseException:
                cluster.stop()
                raise
            _shared.update(cluster=cluster, old_conf=os.environ.get("SLURM_CONF"))
            os.environ["SLURM_CONF"] = str(cluster.conf)
        _shared["users"] += 1
        try:
            yield _shared["cluster"]
        finally:
            _shared["users"] -= 1
            if _shared["users"] == 0:
                _shared["cluster"].stop()
                _shared["cluster"] = None
                if _shared["old_conf"] is None:
                    os.environ.pop("SLURM_CONF", None)
                else:
                    os.environ["SLURM_CONF"] = _shared["old_conf"]


if __name__ == "__main__":  # pragma: no cover
    why = missing_reason()
    if why:
        sys.exit(why)
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/skyfn-slurm")
    root.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave through the with: daemons stopped
    with SlurmCluster(root) as c:
        print(f"Slurm up: export SLURM_CONF={c.conf}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
