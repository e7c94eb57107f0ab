"""Container runtimes: command templates that wrap a worker command line so the worker
runs inside a container of a given *type*.

    rt = make_runtime(ContainerConfig(runtime="podman", types={"t1": {"image": "host"}}))
    launch = rt.wrap("t1", [sys.executable, "-m", "endpoint_agent.manager.worker", "--connect", addr,
                            ..., "--slots-fd", str(fd), "--parent", str(os.getpid())],
                     pass_fds=(fd,), name="skyfn-w-123-0-7")
    proc = launch.popen()             # subprocess.Popen
    ...
    rt.kill(launch, proc)             # forced stop (walltime): really stops the container

How the worker gets Python and the skyfn code inside (`python: host`, the default): the
host interpreter's prefix (sys.base_prefix), the virtualenv (sys.prefix) and the directory
holding the `skyfn` and `endpoint_agent` packages are bind-mounted read-only at the same
paths, PYTHONPATH points at the code, and the same interpreter path is executed. That
needs an image whose libc the interpreter accepts and an interpreter outside /usr (pyenv,
conda, a venv made from them) unless the image is `host`. With `python: /path/in/image`
the image's own Python runs the worker and must have skyfn installed.

Images: `host` (podman, bubblewrap, none) is the host's /usr and /etc read-only in a
fresh mount/pid/ipc/uts namespace: for podman a skeleton root filesystem directory is
assembled (build_skeleton_rootfs) and /usr, /etc files are bound into it. A directory
is a root filesystem (podman `--rootfs DIR --read-only`, bubblewrap `--ro-bind DIR /`,
apptainer sandbox); anything else is an image name (podman/docker registry image,
apptainer .sif or docker://...). No image is ever pulled by skyfn itself.

Reaching the manager: every runtime shares the host network namespace (podman/docker
`--network host`; bubblewrap and apptainer do not unshare it), so `tcp://127.0.0.1:...`
and abstract `ipc://@name` sockets (the manager's default) work from inside; for an
`ipc:///path` address the socket's directory is bind-mounted.

Two worker arguments are rewritten, because their values differ inside the container:
- a file descriptor after an option ending in `-fd` (`--slots-fd N`): podman only hands
  on contiguous descriptors from 3 (`--preserve-fds`), so the descriptors are renumbered
  3, 4, ... by a host-side `bash` redirection; bubblewrap and apptainer inherit them as is;
  docker cannot pass descriptors (Runtime.passes_fds is False: use a file instead).
- `--parent P`: the worker exits when its parent is not P. Inside a pid namespace the
  worker's parent is not the manager: podman/docker (`--init`) and bubblewrap
  (`--unshare-pid`) run it under a tiny init (parent 1), apptainer (`--pid --no-init`)
  as pid 1 (parent 0). Manager death still reaches the worker: podman/docker/apptainer
  clients are started with `setpriv --pdeathsig TERM` (the client forwards SIGTERM to
  the container), bubblewrap runs with `--die-with-parent`; `reap_orphans()` removes
  containers whose manager is gone anyway (e.g. killed while one was being created).
"""
from __future__ import annotations

import os
import shutil
from abc import ABC, abstractmethod
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from endpoint_agent.containers.config import ContainerConfig, ContainerType, parse_mount

CODE_ROOT = str(Path(__file__).resolve().parents[2])  # holds endpoint_agent/ and skyfn/


NO_CONTAINER = "none"  # the type name of a plain worker on the agent's wire (wire.NO_CONTAINER)


class ContainerError(RuntimeError):
    """A container cannot be started as configured; the message says why and what to do."""


@dataclass
class Launch:
    """What to execute for one worker: argv (already wrapped), environment, descriptors."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    name: Optional[str] = None
    runtime: str = "none"
    ctype: Optional[str] = None
    inner_fds: dict[int, int] = field(default_factory=dict)  # host fd -> fd number inside

    def popen(self, **kw) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.argv, env=self.env, pass_fds=self.pass_fds, **kw)


def host_python_paths() -> list[str]:
    """Directories a worker needs, read-only, to run the host interpreter with skyfn."""
    paths = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), sys.prefix, CODE_ROOT]
    if os.path.islink(sys.executable):
        paths.append(os.path.dirname(os.path.realpath(sys.executable)))
    return _outermost(paths)


def _outermost(paths: Sequence[str]) -> list[str]:
    out: list[str] = []
    for p in sorted({os.path.normpath(p) for p in paths}, key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def _base_env(t: ContainerType | None) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "PYTHONUNBUFFERED": "1", "HOME": "/tmp", "LANG": "C.UTF-8"}
    if t is None or t.python == "host":
        parts = [CODE_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != CODE_ROOT]
        env["PYTHONPATH"] = os.pathsep.join(parts)
    if t is not None:
        env.update(t.env)
    return env


def _rewrite_args(argv: list[str], fd_map: dict[int, int], inner_parent: Optional[int]) -> list[str]:
    out = list(argv)
    for i in range(1, len(out)):
        prev = out[i - 1]
        if prev.endswith("-fd") and out[i].isdigit() and int(out[i]) in fd_map:
            out[i] = str(fd_map[int(out[i])])
        elif prev == "--parent" and inner_parent is not None:
            out[i] = str(inner_parent)
    return out


def _ipc_dirs(argv: list[str]) -> list[str]:
    dirs = []
    for a in argv:
        if a.startswith("ipc://") and not a.startswith("ipc://@"):
            dirs.append(os.path.dirname(os.path.abspath(a[len("ipc://"):])))
    return dirs


class Runtime(ABC):
    """A container runtime: `wrap()` turns a worker argv into a Launch."""

    name = "none"
    passes_fds = True
    inner_parent: Optional[int] = None  # the worker's parent pid as seen inside (None: unchanged)
    default_executable: Optional[str] = None

    def __init__(self, config: ContainerConfig | None = None, executable: str | None = None):
        self.config = config or ContainerConfig(runtime=self.name)  # type: ignore[arg-type]
        exe = executable or self.config.executable or self.default_executable
        self.executable = exe

    # --- public ------------------------------------------------------------------
    def type(self, ctype: Optional[str]) -> Optional[ContainerType]:
        if ctype == NO_CONTAINER and NO_CONTAINER not in self.config.types:
            return None
        if ctype is None:
            ctype = self.config.default_type
        if ctype is None:
            return None
        t = self.config.types.get(ctype)
        if t is None:
            raise ContainerError(f"container type {ctype!r} is not configured; configured types: "
                                 f"{', '.join(self.config.types) or '(none)'} (key containers.types)")
        return t

    def available(self) -> bool:
        """True when the runtime's binary exists on this machine."""
        if self.executable is None:
            return True
        return shutil.which(self.executable) is not None

    def wrap(self, ctype: Optional[str], argv: list[str], *, pass_fds: Sequence[int] = (),
             name: Optional[str] = None, env: Optional[dict[str, str]] = None) -> Launch:
        """The Launch of `argv` (a worker command line whose argv[0] is the host Python)
        inside a container of type `ctype` (None: the default type, or no container)."""
        t = self.type(ctype)
        if t is None or self.name == "none":
            from endpoint_agent.procutil import child_env

            e = child_env()
            if t is not None:
                e.update(t.env)
            e.update(env or {})
            return Launch(list(argv), e, tuple(pass_fds), name, "none", ctype, {fd: fd for fd in pass_fds})
        if t.python != "host":
            argv = [t.python, *argv[1:]]
        e = _base_env(t)
        e.update(env or {})
        return self._wrap(ctype or self.config.default_type, t, list(argv), tuple(pass_fds), name, e)

    def kill_argv(self, launch: Launch) -> Optional[list[str]]:
        """The command that force-stops the container of `launch` (None: kill the process)."""
        return None

    def kill(self, launch: Launch, proc: subprocess.Popen, timeout: float = 10.0, always: bool = False) -> None:
        """Force-stop a worker: the container itself, not just the client process. always:
        even when the client has exited (it was killed first: the container outlives it)."""
        cmd = self.kill_argv(launch)
        if cmd is not None and (always or proc.poll() is None):
            try:
                subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass

    def reap(self, label_value: str) -> list[str]:
        """Force-remove containers left behind by a manager (label skyfn.manager=VALUE)."""
        return []

    def problems(self) -> list[str]:
        """Reasons this runtime cannot start containers here ([] when it can)."""
        if not self.available():
            return [f"{self.name}: executable {self.executable!r} not found on PATH"]
        return []

    # --- per runtime ---------------------------------------------------------------
    @abstractmethod
    def _wrap(self, ctype, t, argv, pass_fds, name, env) -> Launch:
        """The runtime's own command line around the worker's argv."""

    def _host_binds(self, t: ContainerType, argv: list[str]) -> list[tuple[str, str, bool]]:
        binds: list[tuple[str, str, bool]] = []
        if t.python == "host":
            if t.image != "host":
                prefix = os.path.realpath(sys.base_prefix)
                if prefix in ("/usr", "/usr/local", "/"):
                    raise ContainerError(
                        f"python: host needs an interpreter outside /usr to bind into image {t.image!r} "
                        f"(this one is in {prefix}); use a pyenv/conda Python or set `python:` to the image's "
                        "own interpreter with skyfn installed")
            binds += [(p, p, True) for p in host_python_paths()]
        binds += [(d, d, False) for d in _ipc_dirs(argv)]
        binds += [parse_mount(m) for m in t.mounts]
        return binds


def _pdeathsig_prefix() -> list[str]:
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


class _OCIRuntime(Runtime):
    """podman and docker: `<exe> run --rm --init --network host ... IMAGE argv`. With
    `--init` a tiny init (catatonit / docker-init) is pid 1 and the worker pid 2: a
    SIGTERM forwarded before the worker installed its handler still ends it (pid 1
    ignores signals it has no handler for), and the container ends with the worker."""

    inner_parent = 1

    def _run_args(self, ctype, t, name, env, pass_fds) -> list[str]:
        args = [self.executable, "run", "--rm", "--init", "--network", "host", "--ipc", "private",
                "--label", "skyfn.worker=1", "--label", f"skyfn.manager={os.getpid()}"]
        if ctype:
            args += ["--label", f"skyfn.type={ctype}"]
        if name:
            args += ["--name", name]
        for k, v in sorted(env.items()):
            args += ["--env", f"{k}={v}"]
        return args

    def _binds_args(self, binds) -> list[str]:
        out = []
        for src, dst, ro in binds:
            out += ["--volume", f"{src}:{dst}:{'ro' if ro else 'rw'}"]
        return out

    def kill_argv(self, launch: Launch) -> Optional[list[str]]:
        if launch.name is None:
            return None
        return [self.executable, "rm", "--force", "--time", "0", launch.name] if self.name == "podman" \
            else [self.executable, "rm", "--force", launch.name]

    def reap_orphans(self) -> list[str]:
        """Force-remove skyfn worker containers whose manager process is gone (a manager
        SIGKILLed while a container was being created leaves one behind)."""
        from endpoint_agent.procutil import pid_alive

        try:
            out = subprocess.run([self.executable, "ps", "--all", "--filter", "label=skyfn.worker=1", "--format",
                                  '{{.ID}} {{index .Labels "skyfn.manager"}}'], capture_output=True, text=True,
                                 timeout=30).stdout.split("\n")
        except (OSError, subprocess.TimeoutExpired):
            return []
        dead = [line.split()[0] for line in out if len(line.split()) == 2 and line.split()[1].isdigit()
                and not pid_alive(int(line.split()[1]))]
        if dead:
            subprocess.run([self.executable, "rm", "--force", *dead], capture_output=True, timeout=60)
        return dead

    def reap(self, label_value: str) -> list[str]:
        try:
            out = subprocess.run([self.executable, "ps", "--all", "--quiet", "--filter",
                                  f"label=skyfn.manager={label_value}"], capture_output=True, text=True,
                                 timeout=30).stdout.split()
            if out:
                subprocess.run([self.executable, "rm", "--force", *out], capture_output=True, timeout=60)
            return out
        except (OSError, subprocess.TimeoutExpired):
            return []


class PodmanRuntime(_OCIRuntime):
    name = "podman"
    default_executable = "podman"

    def __init__(self, config=None, executable=None, skeleton_dir: str | None = None):
        super().__init__(config, executable)
        self.skeleton_dir = skeleton_dir or os.environ.get("SKYFN_ROOTFS_DIR") or "/var/tmp/skyfn-rootfs-host"

    def host_args(self) -> list[str]:
        """Flags this host needs: a RLIMIT_NOFILE hard limit below podman's default
        (1048576) cannot be raised without CAP_SYS_RESOURCE, so pass the current one."""
        import resource

        out = []
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 1048576:
            out += ["--ulimit", f"nofile={hard}:{hard}"]
        # podman's default RLIMIT_NPROC is the caller's; some hosts (this one) refuse to set
        # it again inside crun: a value within the usual 32768 always works.
        _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        n = 32768 if hard == resource.RLIM_INFINITY else min(hard, 32768)
        out += ["--ulimit", f"nproc={n}:{n}"]
        return out

    def _wrap(self, ctype, t, argv, pass_fds, name, env) -> Launch:
        binds = self._host_binds(t, argv)
        fd_map = {fd: 3 + i for i, fd in enumerate(pass_fds)}
        inner = _rewrite_args(argv, fd_map, self.inner_parent)
        args = self._run_args(ctype, t, name, env, pass_fds) + self.host_args()
        if pass_fds:
            args += ["--preserve-fds", str(len(pass_fds))]
        if t.image == "host":
            rootfs = build_skeleton_rootfs(self.skeleton_dir)
            binds = [("/usr", "/usr", True), *[(f, f, True) for f in _ETC_FILES if os.path.exists(f)], *binds]
            image_args = ["--read-only", "--rootfs", rootfs]
        elif t.image.startswith("/"):
            image_args = ["--read-only", "--rootfs", t.image]
        else:
            image_args = ["--pull", "never", t.image]
        args += self._binds_args(binds) + list(self.config.extra_args) + list(t.options) + image_args + inner
        if pass_fds:  # renumber descriptors to 3.. on the host side, then exec podman
            # via high numbers first, so a descriptor already in 3.. is never overwritten
            hi = " ".join(f"{90 + i}<&{fd}" for i, fd in enumerate(pass_fds))
            lo = " ".join(f"{3 + i}<&{90 + i} {90 + i}<&-" for i in range(len(pass_fds)))
            close = " ".join(f"{fd}<&-" for fd in pass_fds if fd not in fd_map.values())
            # (bash: dash accepts single-digit descriptors only)
            args = [shutil.which("bash") or "/bin/bash", "-c", f'exec "$@" {hi} {lo} {close}'.rstrip(), "sh", *args]
        argv_out = _pdeathsig_prefix() + args
        return Launch(argv_out, _client_env(), pass_fds, name, self.name, ctype, fd_map)

    def problems(self) -> list[str]:
        out = super().problems()
        if out:
            return out
        hybrid = cgroup_hybrid_controllers()
        if hybrid:
            out.append("podman/crun: cgroup v1+v2 hybrid with controllers on cgroup v2 "
                       f"({', '.join(hybrid)}): crun refuses to start containers; run "
                       "`python -m endpoint_agent.containers.hostprep` as root (mounts them as v1 hierarchies)")
        return out


class DockerRuntime(_OCIRuntime):
    name = "docker"
    default_executable = "docker"
    passes_fds = False

    def _wrap(self, ctype, t, argv, pass_fds, name, env) -> Launch:
        if pass_fds:
            raise ContainerError("docker run cannot hand file descriptors to a container (the daemon starts it): "
                                 "give the worker a file path instead (e.g. a /dev/shm file bind-mounted with `mounts`)")
        binds = self._host_binds(t, argv)
        inner = _rewrite_args(argv, {}, self.inner_parent)
        args = self._run_args(ctype, t, name, env, pass_fds) + ["--pull", "never"]
        args += self._binds_args(binds) + list(self.config.extra_args) + list(t.options) + [t.image] + inner
        return Launch(_pdeathsig_prefix() + args, _client_env(), (), name, self.name, ctype, {})


class ApptainerRuntime(Runtime):
    """apptainer/singularity: `exec --containall --pid --no-init` keeps the host network."""

    name = "apptainer"
    default_executable = "apptainer"
    inner_parent = 0

    def _wrap(self, ctype, t, argv, pass_fds, name, env) -> Launch:
        binds = self._host_binds(t, argv)
        inner = _rewrite_args(argv, {fd: fd for fd in pass_fds}, self.inner_parent)
        args = [self.executable, "exec", "--containall", "--pid", "--no-init", "--cleanenv", "--writable-tmpfs"]
        for k, v in sorted(env.items()):
            args += ["--env", f"{k}={v}"]
        for src, dst, ro in binds:
            args += ["--bind", f"{src}:{dst}:{'ro' if ro else 'rw'}"]
        args += list(self.config.extra_args) + list(t.options) + [t.image] + inner
        return Launch(_pdeathsig_prefix() + args, _client_env(), pass_fds, name, self.name, ctype,
                      {fd: fd for fd in pass_fds})


class SingularityRuntime(ApptainerRuntime):
    name = "singularity"
    default_executable = "singularity"


class BubblewrapRuntime(Runtime):
    """bubblewrap: unprivileged sandbox (new mount, pid, ipc, uts namespaces; host network)."""

    name = "bubblewrap"
    default_executable = "bwrap"
    inner_parent = 1  # bwrap's init is pid 1 in the new pid namespace, the worker pid 2

    def _wrap(self, ctype, t, argv, pass_fds, name, env) -> Launch:
        binds = self._host_binds(t, argv)
        inner = _rewrite_args(argv, {fd: fd for fd in pass_fds}, self.inner_parent)
        args = [self.executable, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--new-session", "--clearenv"]
        if t.image == "host":
            args += ["--ro-bind", "/usr", "/usr"]
            for link, target in _MERGED_USR_LINKS:
                args += ["--symlink", target, link]
            args += ["--ro-bind", "/etc", "/etc"]
        else:
            args += ["--ro-bind", t.image, "/"]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for src, dst, ro in binds:
            args += ["--ro-bind" if ro else "--bind", src, dst]
        if ctype:
            args += ["--hostname", _hostname(ctype)]
        for k, v in sorted(env.items()):
            args += ["--setenv", k, v]
        args += list(self.config.extra_args) + list(t.options) + ["--", *inner]
        return Launch(args, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, pass_fds, name, self.name, ctype,
                      {fd: fd for fd in pass_fds})


class NoneRuntime(Runtime):
    """Plain worker processes; `wrap` runs every type as one, so this is the same launch."""

    name = "none"

    def _wrap(self, ctype, t, argv, pass_fds, name, env) -> Launch:
        return Launch(list(argv), env, tuple(pass_fds), name, "none", ctype, {fd: fd for fd in pass_fds})


def _hostname(ctype: str) -> str:
    return ("skyfn-" + "".join(c if c.isalnum() or c == "-" else "-" for c in ctype))[:63]


def _client_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "XDG_RUNTIME_DIR", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "DOCKER_HOST",
            "APPTAINER_CACHEDIR", "SINGULARITY_CACHEDIR", "TMPDIR", "LANG")
    return {k: os.environ[k] for k in keep if k in os.environ}


_MERGED_USR_LINKS = [("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")]
_ETC_FILES = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/nsswitch.conf", "/etc/resolv.conf",
              "/etc/ld.so.cache", "/etc/localtime", "/etc/ssl")
_SKELETON_DIRS = ("usr", "etc", "proc", "sys", "dev", "tmp", "run", "var/tmp", "root")


def build_skeleton_rootfs(path: str) -> str:
    """A root filesystem directory of empty mount points and merged-/usr symlinks: the
    host's /usr, /etc files and the Python paths are bound into it read-only at run time.
    Idempotent; about 20 inodes. Returns the path."""
    root = Path(path)
    marker = root / ".skyfn-skeleton"
    if marker.exists():
        return str(root)
    root.mkdir(parents=True, exist_ok=True)
    for d in _SKELETON_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in _MERGED_USR_LINKS:
        p = root / link.lstrip("/")
        if not p.exists() and not p.is_symlink():
            p.symlink_to(target)
    for f in _ETC_FILES:  # mount points for the read-only bound /etc files
        if os.path.isdir(f):
            (root / f.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif os.path.exists(f):
            (root / f.lstrip("/")).touch()
    marker.touch()
    return str(root)


def cgroup_hybrid_controllers() -> list[str]:
    """Controllers enabled on the cgroup v2 mount of a v1+v2 hybrid host (crun refuses those)."""
    try:
        fstype = None
        unified = None
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if parts[1] == "/sys/fs/cgroup":
                    fstype = parts[2]
                if parts[2] == "cgroup2" and parts[1] != "/sys/fs/cgroup":
                    unified = parts[1]
        if fstype != "tmpfs" or unified is None:
            return []
        return Path(unified, "cgroup.controllers").read_text().split()
    except OSError:
        return []


RUNTIMES: dict[str, type[Runtime]] = {
    "none": NoneRuntime, "docker": DockerRuntime, "podman": PodmanRuntime,
    "apptainer": ApptainerRuntime, "singularity": SingularityRuntime, "bubblewrap": BubblewrapRuntime,
}


def make_runtime(config: ContainerConfig, **kw) -> Runtime:
    return RUNTIMES[config.runtime](config, **kw)


def runtime_from_settings(settings: dict | ContainerConfig | None, **kw) -> Optional[Runtime]:
    """The Runtime of a `containers:` mapping (validated; ContainerConfigError names the
    bad key); None when the runtime is `none` and no types are configured."""
    from endpoint_agent.containers.config import parse_container_config

    cfg = settings if isinstance(settings, ContainerConfig) else parse_container_config(settings or {}, "--containers")
    if cfg.runtime == "none" and not cfg.types:
        return None
    rt = make_runtime(cfg, **kw)
    problems = rt.problems()
    if problems:
        raise ContainerError("; ".join(problems))
    return rt


def terminate(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    try:
        proc.send_signal(sig)
    except OSError:
        pass
