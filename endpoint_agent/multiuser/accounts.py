"""From a local account name to what a user agent runs as, and starting a process as it.

`lookup_account(name, deny=..., min_uid=...)` reads the password and group databases (pwd,
grp, os.getgrouplist) into an `Account` (uid, gid, supplementary groups, home) and refuses
with a reason (`AccountRefused`, a `TaskRefused`): an account that does not exist, uid 0 or
the name root, primary or supplementary group 0, a uid below `min_uid`, a name on the
administrator's deny list.

`prepare_workdir(account, template)` expands a template of the admin's choosing (`{home}`,
`{user}`) into the account's working directory and makes sure it exists, is a real directory
(not a symlink) and belongs to the account. A missing one is created *by the account itself*
(a `mkdir -p` run as the account with umask 077: mode 0700, owned by it), so root never
creates or chowns anything along a path the user controls (a symlink planted in the user's
home cannot make root hand /etc to the user). Only if the account may not create it (its
parent is a root-owned directory such as /scratch/skyfn) does root create the last
component itself, 0700, chowned to the account, and only when every ancestor is owned by
root and writable by no one else, or sticky like /tmp (so no one can swap a component).

`load_environment_file(path)` reads the admin's environment file (KEY=VALUE lines, `#`
comments, optional matching quotes around a value; no expansion) with errors naming the
file, the line and the fix. `account_environment(account, extra)` is the whole environment
of a user process: HOME, USER, LOGNAME and PATH for the account, then the file's variables;
nothing of the starting process's own environment.

`start_as(account, argv, workdir=..., environment=...)` starts the process with
subprocess.Popen's `user=`, `group=` and `extra_groups=`: CPython's child (Modules/
_posixsubprocess.c, child_exec) calls setgroups(extra_groups), then setregid(gid, gid),
then setreuid(uid, uid), in that order, after the fork and before exec: supplementary
groups first and the uid last, because once the uid is not 0 the process may no longer
change its groups. setreuid with a real uid set also sets the saved set-user-ID, so the
process cannot regain root (the tests read Uid/Gid/Groups of /proc/PID/status: all four
uids are the account's). Measured on this CPython (3.11.7): *without* `extra_groups` the
child keeps root's supplementary groups (e.g. 0), so `start_as` always passes the account's
list, which os.getgrouplist never returns empty (it holds the primary gid). Note that
child_exec enters `cwd` with chdir() *before* dropping privileges, as root: hence the
ownership checks of `prepare_workdir`. The process also gets a new session (no controlling
terminal of the parent), umask 077 and no inherited file descriptors (close_fds).
"""
from __future__ import annotations

import grp
import os
import pwd
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from endpoint_agent.errors import ConfigError
from endpoint_agent.multiuser.errors import TaskRefused

# Names an account may have: letters, digits, '_', '.', '-' (not first), an optional final '$'
# (Samba machine accounts), at most 32 characters, not all digits (a number reads as a uid).
ACCOUNT_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}\$?$")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
RESERVED_ENV = ("HOME", "USER", "LOGNAME")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POPEN_RESERVED = ("user", "group", "extra_groups", "env", "cwd", "preexec_fn", "start_new_session", "umask",
                   "process_group")


class AccountRefused(TaskRefused):
    """No user agent may run as this account; the message says which and why."""


def check_account_name(name: Any) -> Optional[str]:
    """None if `name` may be an account name, else what is wrong with it."""
    if not isinstance(name, str) or not name:
        return f"{name!r} is not an account name (empty or not a string)"
    if not ACCOUNT_NAME_RE.match(name) or name.rstrip("$").isdigit():
        return (f"{name!r} is not a valid account name (letters, digits, '_', '.', '-', up to 32 characters, "
                "not all digits)")
    return None


@dataclass(frozen=True)
class Account:
    """What a user agent runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, the primary gid included (os.getgrouplist)
    home: str
    shell: str

    def describe(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"


def lookup_account(name: str, deny: Iterable[str] = (), min_uid: int = 1) -> Account:
    """The account `name`, or AccountRefused with the reason it may not run user agents."""
    problem = check_account_name(name)
    if problem:
        raise AccountRefused(f"account refused: {problem}")
    if name == "root":
        raise AccountRefused("account refused: root is never the account of a user agent")
    if name in set(deny):
        raise AccountRefused(f"account refused: {name} is on this endpoint's deny list (deny_accounts)")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise AccountRefused(f"account refused: no local account named {name} on this host") from None
    if pw.pw_uid == 0:
        raise AccountRefused(f"account refused: {name} has uid 0 (root's); it is never the account of a user agent")
    if pw.pw_uid < min_uid:
        raise AccountRefused(f"account refused: {name} has uid {pw.pw_uid}, below this endpoint's min_uid "
                             f"{min_uid} (system accounts do not run user agents)")
    groups = tuple(os.getgrouplist(name, pw.pw_gid))
    if pw.pw_gid == 0 or 0 in groups:
        group0 = grp.getgrgid(0).gr_name
        raise AccountRefused(f"account refused: {name} is in group 0 ({group0}), root's group; remove it from "
                             "that group or deny the account")
    for denied in set(deny):  # a denied name is also refused when it names one of the account's groups
        try:
            if grp.getgrnam(denied).gr_gid in groups:
                raise AccountRefused(f"account refused: {name} is in group {denied}, on this endpoint's deny list "
                                     "(deny_accounts)")
        except KeyError:
            continue
    return Account(name=name, uid=pw.pw_uid, gid=pw.pw_gid, groups=groups, home=pw.pw_dir, shell=pw.pw_shell)


# --- the working directory ---------------------------------------------------------

def workdir_path(account: Account, template: str) -> Path:
    """The template expanded for the account: `{home}` and `{user}` only, absolute, no `..`."""
    try:
        text = template.format(home=account.home, user=account.name)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"working directory template {template!r}: only {{home}} and {{user}} may be used "
                          f"({type(exc).__name__}: {exc})") from None
    path = Path(text)
    if not path.is_absolute() or ".." in path.parts:
        raise ConfigError(f"working directory template {template!r} gives {text!r} for {account.name}: it must be "
                          "an absolute path without '..' (e.g. {home}/.skyfn/work or /scratch/skyfn/{user})")
    return Path(os.path.normpath(text))


def prepare_workdir(account: Account, template: str) -> Path:
    """The account's working directory, created (0700, its own) if missing; checked either way."""
    path = workdir_path(account, template)
    if not _exists_nofollow(path):
        _mkdir_as(account, path)
    if not _exists_nofollow(path):
        _mkdir_as_root(account, path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise AccountRefused(f"working directory {path} of {account.name} is not a directory (a symlink or a file); "
                             "remove it and it is created again")
    if st.st_uid != account.uid:
        raise AccountRefused(f"working directory {path} of {account.name} belongs to uid {st.st_uid}, not to "
                             f"{account.describe()}; give it to the account (chown) or change working_directory")
    return path


def _exists_nofollow(path: Path) -> bool:
    try:
        os.lstat(path)
        return True
    except FileNotFoundError:
        return False


def _mkdir_as(account: Account, path: Path) -> None:
    """`mkdir -p` run as the account itself (umask 077): whatever it may create, it creates."""
    subprocess.run(["mkdir", "-p", "--", str(path)], user=account.uid, group=account.gid,
                   extra_groups=list(account.groups), env={"PATH": DEFAULT_PATH}, cwd="/", umask=0o077,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   close_fds=True, timeout=30)


def _mkdir_as_root(account: Account, path: Path) -> None:
    parent = path.parent
    for ancestor in (parent, *parent.parents):
        try:
            st = os.lstat(ancestor)
        except FileNotFoundError:
            raise ConfigError(f"cannot create the working directory {path} of {account.name}: {ancestor} does not "
                              "exist and the account may not create it; create it (root-owned, mode 0755)") from None
        shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX  # /tmp is fine
        if stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or shared:
            raise ConfigError(
                f"cannot create the working directory {path} of {account.name}: the account may not create it, and "
                f"root creates it only under directories owned by root and writable by no one else, which {ancestor} "
                f"is not (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}, "
                f"{'a symlink' if stat.S_ISLNK(st.st_mode) else 'a directory'})")
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.mkdir(path.name, 0o700, dir_fd=fd)
        os.chown(path.name, account.uid, account.gid, dir_fd=fd, follow_symlinks=False)
        os.chmod(path.name, 0o700, dir_fd=fd)
    finally:
        os.close(fd)


# --- the environment -----------------------------------------------------------------

def load_environment_file(path: Path) -> dict[str, str]:
    """The admin's environment file for user processes: KEY=VALUE lines, `#` comments."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"environment file {path} does not exist: create it (KEY=VALUE lines; "
                          "`skyfn-endpoint configure --multi-user NAME` writes an example) or change "
                          "user_environment_file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"environment file {path} cannot be read: {exc}") from None
    check_admin_file(path, "environment file")
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"environment file {path} line {number}"
        if "=" not in line:
            raise ConfigError(f"{where}: expected KEY=VALUE, got {raw!r}; comment lines start with #")
        key, value = line.split("=", 1)
        key, value = key.strip(), value.strip()
        if key.startswith("export "):
            key = key[len("export "):].strip()
        if not ENV_KEY_RE.match(key):
            raise ConfigError(f"{where}: {key!r} is not a variable name (letters, digits and '_', not starting with "
                              "a digit)")
        if key in RESERVED_ENV:
            raise ConfigError(f"{where}: {key} is set for each account by the endpoint; remove this line")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif value[:1] in ("'", '"'):
            raise ConfigError(f"{where}: the value of {key} opens a quote it does not close")
        if key in env:
            raise ConfigError(f"{where}: {key} is set twice (first value {env[key]!r}); keep one line")
        env[key] = value
    return env


def check_admin_file(path: Path, what: str) -> None:
    """An administrator's file that decides who runs as whom must be writable by its owner only,
    and that owner root or the endpoint's own account."""
    st = os.stat(path)
    me = os.geteuid()
    if st.st_uid not in (0, me):
        raise ConfigError(f"{what} {path} belongs to uid {st.st_uid}; it must belong to root or to the endpoint's "
                          f"account (uid {me}): chown root {path}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                          f"chmod go-w {path}")


def account_environment(account: Account, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The whole environment of a user process: the account's HOME, USER, LOGNAME, PATH, then `extra`
    (the admin's environment file; it may set PATH, never HOME, USER or LOGNAME)."""
    env = {"HOME": account.home, "USER": account.name, "LOGNAME": account.name, "PATH": DEFAULT_PATH}
    for key, value in (extra or {}).items():
        if key in RESERVED_ENV:
            raise ConfigError(f"{key} is set for each account by the endpoint; it may not come from the "
                              "environment file")
        env[key] = value
    return env


# --- starting a process as the account ---------------------------------------------------

def start_as(account: Account, argv: Sequence[str], *, workdir: Path, environment: Mapping[str, str],
             extra_gids: Sequence[int] = (), **popen: Any) -> subprocess.Popen:
    """Start `argv` as the account: groups, gid, uid dropped in that order (see the module's
    docstring), in `workdir`, with exactly `environment` (build it with account_environment).
    `extra_gids`: supplementary groups added to the account's (never 0).

    Other Popen arguments (stdin, stdout, stderr, pass_fds, ...) pass through; the ones that
    decide identity and environment may not."""
    bad = sorted(set(popen) & set(_POPEN_RESERVED))
    if bad:
        raise TypeError(f"start_as sets {', '.join(bad)} itself")
    if account.uid == 0 or account.gid == 0 or 0 in account.groups or 0 in extra_gids:
        raise AccountRefused(f"account refused: {account.describe()} has root's uid or group")
    if not account.groups:  # never: os.getgrouplist holds the primary gid; an empty list would keep root's groups
        raise AccountRefused(f"account refused: {account.describe()} has no group list")
    if environment.get("USER") != account.name or environment.get("HOME") != account.home:
        raise ValueError(f"the environment of a process of {account.name} must have its USER and HOME "
                         "(use account_environment)")
    popen.setdefault("close_fds", True)
    try:
        return subprocess.Popen(list(argv), user=account.uid, group=account.gid,
                                extra_groups=[*account.groups, *extra_gids], cwd=str(workdir),
                                env=dict(environment), start_new_session=True, umask=0o077, **popen)
    except PermissionError as exc:
        if os.geteuid() != 0:
            raise PermissionError(f"starting a process as {account.describe()} needs root (or CAP_SETUID and "
                                  f"CAP_SETGID); this process runs as uid {os.geteuid()}: {exc}") from None
        raise
