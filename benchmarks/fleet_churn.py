"""The fleet benchmark's churn (`--churn`): endpoints SIGKILLed and restarted under load.

A fresh runtime and a fleet of `churn_endpoints` light agents in hosts of `churn_batch`
agents each (benchmarks/fleet_hosts.py). Users submit at `rate` tasks/s to the fleet's
endpoints (Zipf over all of them, benchmarks/fleet_load.py) for `churn_minutes`; every
60 x churn_batch / churn_rate seconds the next host in turn is SIGKILLed (no clean-up:
its agents' held tasks stay leased until their lease expires) and started again at once
from its --home (the same endpoints, their kept credentials), so `churn_rate` endpoints
a minute go down and come back. Then the load stops and every task is waited for
(`drain_timeout`), and every task's record is read back with its events.

- `churn_lost`: tasks the service does not know, or that ended FAILED (the functions
  cannot fail: a failure is the churn's);
- `churn_duplicates`: tasks whose record holds more than one final state, or whose result
  is not their own value;
- `churn_unresolved`: tasks not final after the drain.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from benchmarks.fleet_hosts import HostError, Hosts
from benchmarks.fleet_load import Load, Tally, User, final_states
from benchmarks.fleet_rung import Runtime, agent_config, share_all, wait_online


def killer(hosts: Hosts, period: float, stop: threading.Event, record: list) -> None:
    k = 0
    while not stop.wait(period):
        h = hosts.hosts[k % len(hosts.hosts)]
        k += 1
        t = time.monotonic()
        h.kill()
        try:
            h.start()
            h.wait_ready(120)
            record.append({"host": h.index, "endpoints": h.count, "restart_s": round(time.monotonic() - t, 2),
                           "failed": len(h.failed)})
        except HostError as exc:
            record.append({"host": h.index, "error": str(exc)[:300]})


def run_churn(args, log) -> dict[str, Any]:
    n, b = args.churn_endpoints, args.churn_batch
    out: dict[str, Any] = {"churn_endpoints": n, "churn_batch": b, "churn_per_minute": args.churn_rate,
                           "churn_minutes": args.churn_minutes}
    rt = hosts = None
    users: list[User] = []
    try:
        try:
            rt = Runtime("skyfn-fleet-churn-")
        except Exception as exc:  # noqa: BLE001
            return {**out, "error": f"the embedded runtime did not start: {type(exc).__name__}: {exc}"[:600]}
        from skyfn import Client

        owner = Client(service_url=rt.url, token=rt.owner_token)
        sizes = [b] * (n // b) + ([n % b] if n % b else [])
        hosts = Hosts(sizes, rt.home / "fleet", rt.url, rt.owner_token, agent_config(args), args.threads,
                      args.concurrency, prefix="ch")
        try:
            ids = hosts.start(timeout=args.start_timeout)
            share_all(owner, list(ids.values()))
            wait_online(owner, list(ids.values()), args.start_timeout)
        except HostError as exc:
            return {**out, "error": f"the fleet did not come up: {exc}"[:800]}
        users = [User(rt.state, rt.url, i) for i in range(args.churn_users)]
        tally = Tally()
        load = Load(users, sorted(ids.values()), args.rate, args.zipf, args.batch, tally)
        stop = threading.Event()
        kills: list = []
        period = 60.0 * b / args.churn_rate
        kth = threading.Thread(target=killer, args=(hosts, period, stop, kills), name="fleet-killer", daemon=True)
        log(f"churn: {n} endpoints in {len(sizes)} hosts, a host of {b} killed every {period:.0f} s for "
            f"{args.churn_minutes} min under {args.rate:.0f} tasks/s")
        load.start()
        kth.start()
        time.sleep(args.churn_minutes * 60)
        stop.set()
        kth.join(180)
        unresolved = load.drain(args.churn_drain_timeout)
        finals = {"checked": 0, "unknown": 0, "more_than_one_final_state": 0}
        for i, u in enumerate(users):
            mine = [tid for j, tid in tally.owned if j == i]
            got = final_states(u.client, mine)
            for k in finals:
                finals[k] += got[k]
        out.update({"churn_lost": finals["unknown"] + tally.failed,
                    "churn_duplicates": finals["more_than_one_final_state"] + tally.wrong,
                    "churn_unresolved": unresolved, "tasks_submitted": tally.submitted,
                    "tasks_resolved": tally.resolved, "rejected": tally.rejected, "failures": tally.failures,
                    "records_checked": finals["checked"], "kills": len(kills),
                    "endpoints_killed": sum(k.get("endpoints", 0) for k in kills),
                    "restart_s_max": max((k["restart_s"] for k in kills if "restart_s" in k), default=None),
                    "restart_errors": [k["error"] for k in kills if "error" in k][:3]})
        log(f"churn: {out['kills']} kills ({out['endpoints_killed']} endpoints), lost {out['churn_lost']}, "
            f"duplicates {out['churn_duplicates']}, unresolved {out['churn_unresolved']} of {tally.submitted}")
        return out
    except Exception as exc:  # noqa: BLE001
        return {**out, "error": f"{type(exc).__name__}: {exc}"[:600]}
    finally:
        for u in users:
            u.close()
        if hosts is not None:
            hosts.stop()
        if rt is not None:
            rt.close(keep=args.keep_home)
        os.environ.pop("SKYFN_HOME", None)
