"""Globus staging for the agent: GlobusFile inputs copied in before a task runs and
outputs sent out after it, batched into few Transfer tasks (Balsam's transfer module).

`Stager` (one thread) gathers transfer items from any number of tasks and submits them
per (source, destination) collection pair, at most `batch_size` items per Transfer task
and at most `max_concurrent_transfers` tasks in flight; a partial batch waits up to
`batch_wait` seconds for company. Each Transfer task is polled with backoff (poll_min,
x1.5, up to poll_max) through globus-sdk's TransferClient. Tasks are submitted with
skip_source_errors, so one missing file never fails its batch-mates: its item is read
back from the task's skipped errors and fails only the tasks that need it, with Globus's
reason ("FILE_NOT_FOUND: No such file or directory"); a FAILED Transfer task (fatal
error) fails every task waiting on it with its fatal error. The same file wanted by
several tasks at once is transferred once.

`TaskStaging` ties it to the interchange: a task whose TaskSpec lists `stage_in` /
`stage_out` (the SDK lists its GlobusFile arguments) waits, held but not pending, until
its inputs have arrived (events STAGING_IN, STAGED_IN), then runs; after a SUCCEEDED run
its outputs are transferred before the result is reported (STAGING_OUT, STAGED_OUT). A
failed transfer ends the task FAILED with the reason. Workers find staged files through
SKYFN_GLOBUS_LOCAL (skyfn.data.connectors.globus.Layout), set here for the managers.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Optional

from skyfn.data.connectors.globus import Layout, describe_failure
from skyfn.data.globus_config import GlobusSettings, parse_globus, transfer_client
from skyfn.protocol.states import STAGED_IN, STAGED_OUT, STAGING_IN, STAGING_OUT, now

log = logging.getLogger("skyfn.agent.staging")

ItemKey = tuple[str, str, str, str]   # source collection, source path, destination collection, destination path


@dataclass
class _Item:
    key: ItemKey
    since: float
    waiters: set = field(default_factory=set)


@dataclass
class _Batch:
    task_id: str
    pair: tuple[str, str]
    items: list[_Item]
    deadline: float
    next_poll: float
    delay: float


class Stager:
    """Batched transfers; `on_done(job, error)` is called (from the stager's thread) once all
    items of a job have arrived (error None) or one failed (error: the reason)."""

    def __init__(self, settings: GlobusSettings, client, on_done: Callable[[Hashable, Optional[str]], None]):
        self.settings = settings
        self.tc = client
        self.on_done = on_done
        self.cv = threading.Condition()
        self.pending: dict[tuple[str, str], collections.OrderedDict[ItemKey, _Item]] = {}
        self.by_key: dict[ItemKey, _Item] = {}          # pending or in flight
        self.jobs: dict[Hashable, set[ItemKey]] = {}
        self.active: dict[str, _Batch] = {}
        self.stopping = False
        self.submitted = 0          # Transfer tasks
        self.items_moved = 0
        self.max_active = 0
        self.retry_at = 0.0
        self.thread = threading.Thread(target=self._loop, name="skyfn-globus-stager", daemon=True)

    def start(self) -> "Stager":
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout)

    # --- other threads ---------------------------------------------------------------
    def request(self, job: Hashable, items: list[ItemKey]) -> None:
        if not items:
            self.on_done(job, None)
            return
        mono = time.monotonic()
        with self.cv:
            self.jobs[job] = set(items)
            for key in items:
                item = self.by_key.get(key)
                if item is None:
                    item = self.by_key[key] = _Item(key, mono)
                    self.pending.setdefault((key[0], key[2]), collections.OrderedDict())[key] = item
                item.waiters.add(job)
            self.cv.notify()

    def forget(self, job: Hashable) -> None:
        """A cancelled task: nobody waits for its items any more (transfers in flight finish)."""
        with self.cv:
            for key in self.jobs.pop(job, ()):
                item = self.by_key.get(key)
                if item is not None:
                    item.waiters.discard(job)
                    if not item.waiters:
                        q = self.pending.get((key[0], key[2]))
                        if q is not None and q.pop(key, None) is not None:
                            del self.by_key[key]

    def snapshot(self) -> dict[str, Any]:
        with self.cv:
            return {"pending_items": sum(len(q) for q in self.pending.values()), "active_transfers": len(self.active),
                    "transfers_submitted": self.submitted, "items_moved": self.items_moved,
                    "max_active_transfers": self.max_active, "jobs": len(self.jobs)}

    # --- the thread --------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cv:
                if self.stopping:
                    return
                batches = self._form_batches(time.monotonic())
            try:
                for pair, items in batches:
                    self._submit(pair, items)
                self._poll_due()
            except Exception:  # noqa: BLE001 - the stager must outlive a surprise; its tasks keep waiting
                log.exception("Globus stager step failed; retrying")
                time.sleep(1.0)
            with self.cv:
                if self.stopping:
                    return
                self.cv.wait(self._next_wake(time.monotonic()))

    def _form_batches(self, mono: float) -> list[tuple[tuple[str, str], list[_Item]]]:
        out: list[tuple[tuple[str, str], list[_Item]]] = []
        if mono < self.retry_at:
            return out
        s = self.settings
        room = s.max_concurrent_transfers - len(self.active)
        for pair, q in self.pending.items():
            while q and room > 0:
                oldest = next(iter(q.values())).since
                if len(q) < s.batch_size and mono - oldest < s.batch_wait:
                    break
                take = [q.popitem(last=False)[1] for _ in range(min(s.batch_size, len(q)))]
                out.append((pair, take))
                room -= 1
        for pair in [p for p, q in self.pending.items() if not q]:
            del self.pending[pair]
        return out

    def _next_wake(self, mono: float) -> float:
        times = [mono + 30.0] + [b.next_poll for b in self.active.values()]
        if len(self.active) < self.settings.max_concurrent_transfers:
            times += [max(next(iter(q.values())).since + self.settings.batch_wait, self.retry_at)
                      for q in self.pending.values() if q]
        return max(0.005, min(times) - mono)

    def _submit(self, pair: tuple[str, str], items: list[_Item]) -> None:
        import globus_sdk

        s = self.settings
        data = globus_sdk.TransferData(pair[0], pair[1], label=f"skyfn staging ({len(items)} items)",
                                       skip_source_errors=True, sync_level=s.sync_level or globus_sdk.MISSING,
                                       notify_on_succeeded=False, notify_on_failed=False, notify_on_inactive=False)
        for item in items:
            data.add_item(item.key[1], item.key[3])
        try:
            task_id = self.tc.submit_transfer(data)["task_id"]
        except globus_sdk.TransferAPIError as exc:
            if exc.http_status in (429,) or exc.http_status >= 500:
                return self._requeue(pair, items, f"{exc.http_status} {exc.code}")
            return self._finish(items, f"Globus refused the Transfer task ({exc.http_status} {exc.code}: "
                                       f"{exc.message})")
        except (globus_sdk.GlobusConnectionError, OSError) as exc:
            return self._requeue(pair, items, type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - e.g. credentials that cannot be refreshed
            return self._finish(items, f"could not submit a Globus Transfer task: {type(exc).__name__}: {exc}")
        mono = time.monotonic()
        with self.cv:
            self.active[task_id] = _Batch(task_id, pair, items, mono + s.transfer_timeout, mono + s.poll_min,
                                          s.poll_min)
            self.submitted += 1
            self.max_active = max(self.max_active, len(self.active))
        log.info("Globus Transfer task %s: %d item(s) %s -> %s", task_id, len(items), pair[0], pair[1])

    def _requeue(self, pair: tuple[str, str], items: list[_Item], why: str) -> None:
        log.warning("Globus Transfer submission failed (%s); retrying in %.0f s", why, self.settings.poll_max)
        with self.cv:
            q = self.pending.setdefault(pair, collections.OrderedDict())
            for item in reversed(items):
                q[item.key] = item
                q.move_to_end(item.key, last=False)
            self.retry_at = time.monotonic() + min(self.settings.poll_max, 5.0)

    def _poll_due(self) -> None:
        import globus_sdk

        mono = time.monotonic()
        with self.cv:
            due = [b for b in self.active.values() if b.next_poll <= mono]
        for b in due:
            try:
                task = self.tc.get_task(b.task_id).data
            except globus_sdk.GlobusAPIError as exc:
                if exc.http_status in (403, 404):  # gone, or no longer ours to see: it will not finish for us
                    self._done(b, f"Globus Transfer task {b.task_id} cannot be read any more ({exc.http_status} "
                                  f"{exc.code}: {exc.message})")
                    continue
                log.warning("polling Globus task %s failed (%s); will retry", b.task_id, exc.code)
                task = {"status": "ACTIVE"}
            except (globus_sdk.GlobusConnectionError, OSError) as exc:
                log.warning("polling Globus task %s failed (%s); will retry", b.task_id, type(exc).__name__)
                task = {"status": "ACTIVE"}
            status = task.get("status")
            if status == "ACTIVE" or status == "INACTIVE":
                if time.monotonic() >= b.deadline:
                    try:
                        self.tc.cancel_task(b.task_id)
                    except Exception:  # noqa: BLE001 - it is failed here either way
                        pass
                    self._done(b, f"Globus Transfer task {b.task_id} did not finish within "
                                  f"{self.settings.transfer_timeout:.0f} s (data.globus.transfer_timeout); "
                                  "cancelled it")
                    continue
                b.delay = min(self.settings.poll_max, b.delay * 1.5)
                b.next_poll = time.monotonic() + b.delay
                continue
            if status == "SUCCEEDED":
                failed: dict[tuple[str, str], str] = {}
                if task.get("subtasks_skipped_errors"):   # not files_skipped: those were in sync
                    for e in self.tc.paginated.task_skipped_errors(b.task_id).items():
                        failed[(e["source_path"], e["destination_path"])] = (
                            f"{e.get('error_code')}: {e.get('error_details')}")
                self._done(b, None, failed)
            else:
                self._done(b, f"Globus Transfer task {b.task_id} {status}: {describe_failure(task)}")

    def _done(self, b: _Batch, error: Optional[str], failed: Optional[dict] = None) -> None:
        with self.cv:
            self.active.pop(b.task_id, None)
            self.cv.notify()
        per_item = []
        for item in b.items:
            why = error
            if why is None and failed and (item.key[1], item.key[3]) in failed:
                why = (f"Globus Transfer task {b.task_id}: {failed[(item.key[1], item.key[3])]} "
                       f"(globus://{item.key[0]}{item.key[1]})")
            per_item.append((item, why))
        self._finish_each(per_item)

    def _finish(self, items: list[_Item], error: str) -> None:
        self._finish_each([(item, error) for item in items])

    def _finish_each(self, results: list[tuple[_Item, Optional[str]]]) -> None:
        finished: list[tuple[Hashable, Optional[str]]] = []
        with self.cv:
            for item, why in results:
                self.by_key.pop(item.key, None)
                if why is None:
                    self.items_moved += 1
                for job in item.waiters:
                    left = self.jobs.get(job)
                    if left is None:
                        continue
                    if why is not None:  # the job fails at its first failed item
                        del self.jobs[job]
                        finished.append((job, why))
                        continue
                    left.discard(item.key)
                    if not left:
                        del self.jobs[job]
                        finished.append((job, None))
        for job, why in finished:
            try:
                self.on_done(job, why)
            except Exception:  # noqa: BLE001
                log.exception("staging callback failed for %s", job)


# --- the interchange's side -------------------------------------------------------------
STAGING = b"<globus-staging>"   # T_MGR of a task held while its files move (no manager has it)


class TaskStaging:
    """Holds tasks while their GlobusFiles move; runs on the interchange's thread except
    `_staged` (the stager's thread), which hands results over through the control queue."""

    def __init__(self, ix, settings: Any, endpoint_dir: Optional[Path]):
        self.ix = ix
        try:
            self.settings = parse_globus(settings.model_dump(exclude_none=True)
                                         if isinstance(settings, GlobusSettings) else settings)
        except ValueError as exc:
            from endpoint_agent.errors import ConfigError

            raise ConfigError(str(exc)) from None
        s = self.settings
        self.layout = Layout(s.collection, s.root_path, s.stage_dir)
        s.root_path.mkdir(parents=True, exist_ok=True)
        try:
            self.tc = transfer_client(s, s.token_path(endpoint_dir))
        except ValueError as exc:  # no or unreadable credentials: the agent does not start
            from endpoint_agent.errors import ConfigError

            raise ConfigError(str(exc)) from None
        os.environ.update(self.layout.env())  # the managers and workers started from now on see it
        self.stager = Stager(s, self.tc, self._staged).start()
        self.held: dict[str, dict] = {}   # task id -> {"key", "events", "out": [ItemKey], "rec"}

    # called from ingest for a task whose spec lists files
    def admit(self, key: int, t: list, spec) -> bool:
        """Hold the task for its inputs (True), or let it be pended now (False: nothing to fetch)."""
        from endpoint_agent.task_record import T_ID, T_MGR, T_PACK, T_RECV

        lay = self.layout
        try:  # the message is not trusted: no '..' out of the staging area, no relative paths
            stage_in = [_checked(i) for i in spec.stage_in or ()]
            stage_out = [_checked(o) for o in spec.stage_out or ()]
        except ValueError as exc:
            del self.ix.tasks[key]
            self.ix._add_result({"task_id": t[T_ID], "state": "FAILED", "reason": f"stage-in refused: {exc}",
                                 "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
            return True
        ins = [(i["collection"], i["path"], lay.collection, lay.endpoint_path(i["collection"], i["path"]))
               for i in stage_in if i["collection"] != lay.collection]
        outs = []
        for o in stage_out:
            local = lay.local(o["collection"], o["path"], True)
            local.parent.mkdir(parents=True, exist_ok=True)   # the task writes its output here
            if o["collection"] != lay.collection:
                outs.append((lay.collection, lay.endpoint_path(o["collection"], o["path"], True),
                             o["collection"], o["path"]))
        h = self.held[t[T_ID]] = {"key": key, "events": [], "out": outs}
        if not ins:
            return False
        h["events"].append([STAGING_IN, now()])
        t[T_MGR] = STAGING
        self.stager.request(("in", key, t[T_ID]), ins)
        return True

    def _staged(self, job: tuple[str, int, str], error: Optional[str]) -> None:
        self.ix.control.append(("staged", (job, error, now())))
        self.ix.wake_up()

    # called from do_control
    def on_staged(self, job: tuple[str, int, str], error: Optional[str], ts: float) -> None:
        from endpoint_agent.task_record import T_ID, T_MGR, T_PACK, T_RECV

        direction, key, tid = job
        ix = self.ix
        t = ix.tasks.get(key)
        h = self.held.get(tid)
        if t is None or h is None or t[T_MGR] is not STAGING:  # cancelled meanwhile
            return
        if direction == "in":
            if error is not None:
                del ix.tasks[key]
                del self.held[tid]
                log.warning("task %s failed: stage-in: %s", t[T_ID], error)
                ix._add_result({"task_id": tid, "state": "FAILED", "reason": f"stage-in failed: {error}",
                                "events": [["DISPATCHED", t[T_RECV]], *h["events"]]}, t[T_PACK])
                ix._room()
                return
            h["events"].append([STAGED_IN, ts])
            t[T_MGR] = None
            ix.pend(key, t)
            return
        rec = h["rec"]
        del ix.tasks[key]
        del self.held[tid]
        if error is None:
            rec["events"].append([STAGED_OUT, ts])
        else:
            rec.update(state="FAILED", reason=f"stage-out failed: {error}")
            rec.pop("result", None)
        ix._add_result(rec, t[T_PACK])
        ix._room()

    # called from on_results before the result is added
    def result(self, key: int, t: list, rec: dict) -> bool:
        """Add the staging events to rec; True when the task is held for its outputs."""
        from endpoint_agent.task_record import T_MGR

        h = self.held.get(rec["task_id"])
        if h is None:
            return False
        rec["events"][1:1] = h["events"]  # after DISPATCHED, before RUNNING
        if rec["state"] != "SUCCEEDED" or not h["out"]:
            del self.held[rec["task_id"]]
            return False
        rec["events"].append([STAGING_OUT, now()])
        h["rec"] = rec
        t[T_MGR] = STAGING
        self.ix.tasks[key] = t
        self.stager.request(("out", key, rec["task_id"]), h["out"])
        return True

    def settle(self, rec: dict) -> None:
        """A held task ended another way (lost manager, timeout, no node fits): its events, no leak."""
        h = self.held.pop(rec["task_id"], None)
        if h is not None:
            rec["events"][1:1] = h["events"]
            self.stager.forget(("in", h["key"], rec["task_id"]))

    def forget(self, tid: str) -> None:
        h = self.held.pop(tid, None)
        if h is not None:
            self.stager.forget(("in", h["key"], tid))
            self.stager.forget(("out", h["key"], tid))

    def close(self) -> None:
        self.stager.stop()
        close = getattr(self.tc, "close", None)
        if close is not None:
            close()


def _checked(item: Any) -> dict:
    """A stage item {collection, path} as GlobusFile would make it (ValueError otherwise)."""
    from skyfn.data.connectors.globus import GlobusFile

    if not isinstance(item, dict) or not isinstance(item.get("collection"), str):
        raise ValueError(f"not a {{collection, path}} item: {item!r}")
    gf = GlobusFile(item["collection"], item.get("path"))
    return {"collection": gf.collection, "path": gf.path}


def no_staging_reason(endpoint_id: str) -> str:
    return (f"the task has GlobusFile arguments but endpoint {endpoint_id} has no Globus settings: add "
            "`data: globus: {collection: <its collection UUID>, root: <that collection's local directory>}` "
            "to its config.yaml (docs/data.md, Globus files)")
