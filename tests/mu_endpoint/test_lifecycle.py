"""A multi-user endpoint's user agents over time (issue 23): a user agent per (user, config) --
a second user_config gets a second agent of the same account; an idle user agent stops after
idle_timeout and the next task starts it again; a graceful stop and start of the privileged
process keeps working."""
from __future__ import annotations

import time

import yaml

from skyfn import Executor


def me():
    import os

    return os.getuid(), os.getpid()


def _alive(site, account):
    return [a for a in site.user_agents() if a["account"] == account and a["alive"]]


def _restart_with(site, **settings):
    path = site.endpoint_dir / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config.update(settings)
    path.write_text(yaml.safe_dump(config))
    site.stop()
    site.start()


def test_one_agent_per_config_idle_stop_and_start_again(site):
    account = site.accounts["alice"]
    _restart_with(site, idle_timeout=3)
    try:
        with site.user("alice") as alice:
            with Executor(endpoint_id=site.endpoint_id, client=alice) as ex:
                uid, first_pid = ex.submit(me).result(timeout=120)
            with Executor(endpoint_id=site.endpoint_id, client=alice, user_config={"workers": 3}) as ex3:
                uid3, _ = ex3.submit(me).result(timeout=120)
            assert uid3 == uid
            keys = {a["key"] for a in _alive(site, account)}
            assert len(keys) == 2, site.user_agents()  # two configs, two agents, one account
            deadline = time.monotonic() + 60
            while _alive(site, account) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not _alive(site, account), f"idle user agents still running: {site.user_agents()}"
            with Executor(endpoint_id=site.endpoint_id, client=alice) as ex:
                uid_again, pid_again = ex.submit(me).result(timeout=120)
            assert uid_again == uid and pid_again != first_pid
    finally:
        _restart_with(site, idle_timeout=600)


def test_tasks_sent_while_an_idle_agent_stops_all_finish(site):
    """A pack routed to a user agent as it stops for idleness is run by the agent started again
    for it, not left in its stream until the user's next task."""
    account = site.accounts["bob"]
    _restart_with(site, idle_timeout=1)
    try:
        with site.user("bob") as bob:
            fid = bob.register_function(me)
            bob.get_result(bob.run(fid, endpoint_id=site.endpoint_id), timeout=120)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(a["stopping"] for a in _alive(site, account)):
                time.sleep(0.01)
            assert any(a["stopping"] for a in _alive(site, account)), site.user_agents()
            sent = []
            t = time.monotonic()
            while time.monotonic() - t < 3:
                sent.append(bob.run(fid, endpoint_id=site.endpoint_id))
                time.sleep(0.03)
            results = [bob.get_result(tid, timeout=60) for tid in sent]
            assert len(results) == len(sent) and all(r[0] == results[0][0] for r in results)
    finally:
        _restart_with(site, idle_timeout=600)
