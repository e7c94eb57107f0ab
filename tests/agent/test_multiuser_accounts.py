"""endpoint_agent.multiuser.accounts with real accounts (issue 23): created here with `useradd -m`
(unique names, so parallel runs cannot collide) and removed with `userdel -r` even when a test
fails. Processes are started as them for real and report what the kernel says they are."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from endpoint_agent.errors import ConfigError
from endpoint_agent.multiuser.accounts import (AccountRefused, account_environment, load_environment_file,
                                               lookup_account, prepare_workdir, start_as)

PYTHON = "/usr/bin/python3"  # the system's: every account may run it (the venv's lives under /root)
as_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                             reason="creating accounts and starting processes as them needs root and useradd")

REPORT = r"""
import json, os, sys
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(),
       "groups": sorted(os.getgroups()), "status_uid": status["Uid"].split(), "status_gid": status["Gid"].split(),
       "cwd": os.getcwd(), "env": dict(os.environ), "umask": os.umask(0)}
for what in sys.argv[1:]:
    kind, _, arg = what.partition("=")
    try:
        if kind == "read":
            open(arg).read()
        elif kind == "list":
            os.listdir(arg)
        elif kind == "kill":
            os.kill(int(arg), 0)
        out[what] = "allowed"
    except PermissionError as exc:
        out[what] = "denied"
print(json.dumps(out))
"""


@pytest.fixture
def accounts():
    """make(groups=()) -> a new account's name; every account and group made is removed afterwards."""
    made_users: list[str] = []
    made_groups: list[str] = []

    class Maker:
        def user(self, groups=(), extra_args=()) -> str:
            name = f"sfa{secrets.token_hex(4)}"
            args = ["useradd", *([] if "-M" in extra_args else ["-m"]), "-s", "/bin/sh", *extra_args]
            if groups:
                args += ["-G", ",".join(groups)]
            made_users.append(name)
            subprocess.run([*args, name], check=True, capture_output=True)
            home = Path(os.path.expanduser(f"~{name}"))
            if home.is_dir():
                home.chmod(0o700)
            return name

        def group(self) -> str:
            name = f"sfg{secrets.token_hex(4)}"
            made_groups.append(name)
            subprocess.run(["groupadd", name], check=True, capture_output=True)
            return name

    try:
        yield Maker()
    finally:
        for name in made_users:
            subprocess.run(["userdel", "-f", "-r", name], capture_output=True)
        for name in made_groups:
            subprocess.run(["groupdel", name], capture_output=True)


def _run_as(account, workdir, env, *checks):
    proc = start_as(account, [PYTHON, "-c", REPORT, *checks], workdir=workdir, environment=env,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@as_root
def test_a_process_started_for_alice_is_alice_and_nothing_of_root(accounts, tmp_path, monkeypatch):
    team = accounts.group()
    alice = accounts.user(groups=[team])
    envfile = tmp_path / "user_environment"
    envfile.write_text("# site settings\nLANG=C.UTF-8\nSITE_NAME=example\nQUOTED='two words'\n\n"
                       "export PROXY=\"http://p:3128\"\n")
    monkeypatch.setenv("SKYFN_ROOT_MARKER", "root-only-" + secrets.token_hex(4))
    account = lookup_account(alice)
    assert account.name == alice and account.uid >= 1000 and account.home == f"/home/{alice}"
    assert set(account.groups) == {account.gid, __import__("grp").getgrnam(team).gr_gid}

    workdir = prepare_workdir(account, "{home}/skyfn-work/{user}")
    assert workdir == Path(account.home) / "skyfn-work" / alice
    st = os.lstat(workdir)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (account.uid, account.gid, 0o700)

    env = account_environment(account, load_environment_file(envfile))
    saved = os.getgroups()
    os.setgroups([0, 4, 100])  # root with supplementary groups, as a login shell may have: none may reach alice
    try:
        report = _run_as(account, workdir, env)
    finally:
        os.setgroups(saved)
    assert (report["uid"], report["euid"]) == (account.uid, account.uid)
    assert (report["gid"], report["egid"]) == (account.gid, account.gid)
    assert report["status_uid"] == [str(account.uid)] * 4  # real, effective, saved, filesystem: no way back
    assert report["status_gid"] == [str(account.gid)] * 4
    assert report["groups"] == sorted(account.groups) and 0 not in report["groups"]
    assert report["cwd"] == str(workdir)
    assert report["umask"] == 0o077
    assert report["env"] == {"HOME": account.home, "USER": alice, "LOGNAME": alice,
                             "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "SITE_NAME": "example",
                             "QUOTED": "two words",
                             "PROXY": "http://p:3128"}
    assert "SKYFN_ROOT_MARKER" in os.environ and "SKYFN_ROOT_MARKER" not in report["env"]


@as_root
def test_root_uid_0_group_0_denied_and_unknown_accounts_are_refused_with_the_reason(accounts):
    team = accounts.group()
    alice = accounts.user(groups=[team])
    with pytest.raises(AccountRefused, match="root is never the account of a user agent"):
        lookup_account("root")
    with pytest.raises(AccountRefused, match=f"{alice} is on this endpoint's deny list"):
        lookup_account(alice, deny=["root", alice])
    with pytest.raises(AccountRefused, match=f"{alice} is in group {team}, on this endpoint's deny list"):
        lookup_account(alice, deny=[team])
    with pytest.raises(AccountRefused, match="no local account named sfanosuchuser on this host"):
        lookup_account("sfanosuchuser")
    with pytest.raises(AccountRefused, match="below this endpoint's min_uid"):
        lookup_account(alice, min_uid=2**30)
    with pytest.raises(AccountRefused, match="not a valid account name"):
        lookup_account("../etc")
    alias = accounts.user(extra_args=["-o", "-u", "0", "-M", "-N", "-g", "100"])  # a second name for uid 0
    with pytest.raises(AccountRefused, match=f"{alias} has uid 0"):
        lookup_account(alias)
    wheel = accounts.user(extra_args=["-g", "0"])  # primary group root
    with pytest.raises(AccountRefused, match=f"{wheel} is in group 0"):
        lookup_account(wheel)


@as_root
def test_bob_cannot_read_alices_home_or_signal_her_processes(accounts):
    alice, bob = lookup_account(accounts.user()), lookup_account(accounts.user())
    secret = Path(alice.home) / "notes.txt"
    secret.write_text("alice's")
    os.chown(secret, alice.uid, alice.gid)
    secret.chmod(0o600)
    assert stat.S_IMODE(os.stat(alice.home).st_mode) == 0o700
    alice_wd = prepare_workdir(alice, "{home}/work")
    bob_wd = prepare_workdir(bob, "{home}/work")
    sleeper = start_as(alice, ["sleep", "60"], workdir=alice_wd, environment=account_environment(alice))
    try:
        mine = _run_as(alice, alice_wd, account_environment(alice), f"read={secret}", f"kill={sleeper.pid}")
        assert mine[f"read={secret}"] == "allowed" and mine[f"kill={sleeper.pid}"] == "allowed"
        theirs = _run_as(bob, bob_wd, account_environment(bob), f"read={secret}", f"list={alice.home}",
                         f"kill={sleeper.pid}")
        assert theirs[f"read={secret}"] == "denied"
        assert theirs[f"list={alice.home}"] == "denied"
        assert theirs[f"kill={sleeper.pid}"] == "denied"
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait(timeout=30)


@as_root
def test_working_directories_root_creates_and_ones_that_are_not_the_accounts(accounts, tmp_path):
    alice = lookup_account(accounts.user())
    base = tmp_path / "scratch"
    base.mkdir(mode=0o755)  # root's, under root-owned or sticky directories: root creates alice's directory there
    wd = prepare_workdir(alice, f"{base}/{{user}}")
    st = os.lstat(wd)
    assert wd == base / alice.name and (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o700)
    assert prepare_workdir(alice, f"{base}/{{user}}") == wd  # an existing one of hers is used as it is

    taken = base / "taken"
    taken.mkdir()
    with pytest.raises(AccountRefused, match=f"belongs to uid 0, not to {alice.name}"):
        prepare_workdir(alice, str(taken))
    (base / "link").symlink_to(taken)
    with pytest.raises(AccountRefused, match="is not a directory"):
        prepare_workdir(alice, str(base / "link"))
    for bad in ("relative/{user}", "{home}/../{user}", "{home}/{uid}"):
        with pytest.raises(ConfigError, match="working directory template"):
            prepare_workdir(alice, bad)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by anyone, not sticky: root creates nothing under it
    with pytest.raises(ConfigError, match=f"which {shared} is not"):
        prepare_workdir(alice, f"{shared}/{{user}}")


@as_root
def test_start_as_takes_no_identity_or_environment_of_the_callers(accounts):
    alice = lookup_account(accounts.user())
    wd = prepare_workdir(alice, "{home}/work")
    with pytest.raises(TypeError, match="start_as sets user itself"):
        start_as(alice, ["true"], workdir=wd, environment=account_environment(alice), user=0)
    with pytest.raises(ValueError, match="USER and HOME"):
        start_as(alice, ["true"], workdir=wd, environment={"PATH": "/usr/bin"})


def test_environment_file_errors_name_the_file_the_line_and_the_fix(tmp_path):
    path = tmp_path / "env"
    cases = [
        ("A=1\nnot a variable line\n", "line 2: expected KEY=VALUE"),
        ("1A=x\n", "line 1: '1A' is not a variable name"),
        ("HOME=/root\n", "line 1: HOME is set for each account by the endpoint; remove this line"),
        ("A='open\n", "line 1: the value of A opens a quote it does not close"),
        ("A=1\n# c\nA=2\n", "line 3: A is set twice"),
    ]
    for text, message in cases:
        path.write_text(text)
        path.chmod(0o600)
        with pytest.raises(ConfigError) as info:
            load_environment_file(path)
        assert str(info.value).startswith(f"environment file {path} ") and message in str(info.value)
    path.write_text("A=1\n")
    path.chmod(0o666)
    with pytest.raises(ConfigError, match=f"writable by group or others \\(mode 0666\\): chmod go-w {path}"):
        load_environment_file(path)
    with pytest.raises(ConfigError, match="does not exist: create it"):
        load_environment_file(tmp_path / "missing")
