"""Lanes unbound after `lane_idle_timeout` (issue 39), with real processes: alice's user agent
stops after `idle_timeout`; once idle for `lane_idle_timeout` its lane is closed at the service
(binding, lane record and queue login gone) and the agent forgotten by the privileged process
(its ACL user, its streams and its record in the router's Redis gone). Her next tasks come
through the router, which binds the lane again and starts her agent: every task runs, once,
as her, audited once. A task the service sent to the lane as it was being closed (a
submission that read the binding just before: simulated by putting the old binding back at
the service) is taken back from the closed lane and run, not lost."""
from __future__ import annotations

import redis
import yaml

from skyfn import Executor
from skyfn.protocol.user_config import config_key
from tests.mu_endpoint.tenant import record_of, router_port, wait_for

IDLE_S, LANE_IDLE_S = 1, 3


def whoami(x):
    import os

    return os.getuid(), x


def _restart_with(site, **settings):
    path = site.endpoint_dir / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config.update(settings)
    path.write_text(yaml.safe_dump(config))
    site.stop()
    site.start()


def _service(site) -> redis.Redis:
    return redis.Redis.from_url(site.state.read_runtime()["redis_url"], socket_timeout=10, decode_responses=True)


def _agents_of(site, account):
    return [a for a in site.user_agents() if a["account"] == account]


def _unbound(site, account, key):
    """alice's agent is forgotten (status and record) once her lane is unbound."""
    return not _agents_of(site, account) and not (site.endpoint_dir / "router" / "agents" / f"{key}.json").exists()


def _taken_back(site) -> int:
    """Lines of the privileged process's log saying it routed again what a closed lane held."""
    return (site.endpoint_dir / "mep.log").read_text(errors="replace").count("routed again")


def test_an_idle_lane_is_unbound_and_the_next_task_binds_it_again(site):
    account, ep = site.accounts["alice"], site.endpoint_id
    binding = f"alice-id {config_key(None)}"
    service = _service(site)
    _restart_with(site, idle_timeout=IDLE_S, lane_idle_timeout=LANE_IDLE_S)
    try:
        with site.user("alice") as alice, Executor(endpoint_id=ep, client=alice) as ex:
            uid, _ = ex.submit(whoami, 0).result(timeout=120)
            key = wait_for(lambda: next((a["key"] for a in _agents_of(site, account) if a["lane"]), None),
                           what="alice's user agent with a lane")
            rec = record_of(site, key)
            lane, acl_user = rec["lane"]["lane"], rec["acl_user"]
            assert service.hget(f"lanes:{ep}", binding) == lane
            assert f"ln-{ep}-{lane}" in service.acl_users()
            unbound_before = site.status()["lanes_unbound_idle"]

            wait_for(lambda: _unbound(site, account, key), timeout=90, what="alice's lane unbound")
            status = site.status()
            assert status["lanes_unbound_idle"] == unbound_before + 1
            # the service: no binding, no lane record, no queue login
            assert service.hget(f"lanes:{ep}", binding) is None
            assert not service.exists(f"lane:{ep}:{lane}", f"lane:{ep}:{lane}:ids")
            assert f"ln-{ep}-{lane}" not in service.acl_users()
            # the router's Redis: no ACL user and no key of the forgotten agent
            router = redis.Redis(host="127.0.0.1", port=router_port(site), username="skyfn-router",
                                 password=(site.endpoint_dir / "router" / "router.password").read_text().strip(),
                                 socket_timeout=10, decode_responses=True)
            assert acl_user not in router.acl_users()
            assert router.keys(f"mu:{account}:{rec['digest'][:12]}:*") == []
            router.close()

            # her next tasks: through the router, the lane bound again, her agent started
            futures = [ex.submit(whoami, i) for i in range(1, 21)]
            assert [f.result(timeout=120) for f in futures] == [(uid, i) for i in range(1, 21)]
            again = wait_for(lambda: next((a for a in _agents_of(site, account) if a["lane"]), None),
                             what="alice's lane bound again")
            assert again["key"] == key and record_of(site, key)["lane"]["lane"] == lane
            assert service.hget(f"lanes:{ep}", binding) == lane
            lines = site.audit_of([f.task_id for f in futures], timeout=60)
            assert sorted(r["task_id"] for r in lines) == sorted(f.task_id for f in futures)  # once each
            assert {r["account"] for r in lines} == {account}

            # unbound again; then a task the service sends to the closed lane (it read the old binding)
            wait_for(lambda: _unbound(site, account, key), timeout=90, what="alice's lane unbound again")
            taken_back = _taken_back(site)
            service.hset(f"lanes:{ep}", binding, lane)  # what a submission racing the close still saw
            late = ex.submit(whoami, 99)
            assert late.result(timeout=180) == (uid, 99)
            assert site.audit_of([late.task_id], timeout=60)[0]["account"] == account
            assert _taken_back(site) > taken_back  # it came out of the closed lane, through the router
        assert site.proc.poll() is None, site.log_tail()
    finally:
        _restart_with(site, idle_timeout=600, lane_idle_timeout=3600)
        service.close()

