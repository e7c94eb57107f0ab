"""Direct sessions, the agent's side: the socket SDKs send task packs to (skyfn.protocol.direct).

The DirectServer is owned by the interchange and runs on its thread: its ROUTER socket is
in the interchange's poller, so a pack goes from the SDK to the intake and on to a
manager within one step of the loop. The socket is always a CurveZMQ server, with the
interchange's key pair (curve/ in the endpoint directory); the session key the service
signs tokens with is new at each start, so a restart invalidates every session.

A SUBMIT is checked before anything of it runs: the token (signature, endpoint, expiry;
verified once per token string, then cached until it expires), each task's function in
the token, and every function body sent against the token's digest (a body verified once
is kept by (function id, digest), so a later pack may leave it out). Anything wrong
refuses the whole pack with one REFUSED frame, as does a pack arriving while the agent
stops (bad_token: the session ends with this agent's run). A good pack enters the intake like a
polled one, with a DirectReceipt (receipt.py) instead of a queue receipt and the
token's user as owner: the agent's allowlist still applies there. Results come back
through the ResultBatcher, which keeps them for `flush`, called at the end of each step:
one RESULTS frame per SDK per step (chunked when large). A vanished SDK costs a dropped
reply and a counter, never a blocked or failed loop. The results sent lately stay in a
bounded replay cache (RECENT_*): a PING that asks about one of them (its reply was lost
with a dropped connection) gets it again, so a reconnected SDK resolves it without the
service, and nothing runs twice.

With `reach: rendezvous` (or `auto`) the socket is also, or only, bound to a private
ipc:// path: no port is opened. The agent LISTENs at the rendezvous server instead
(reach.py, started with `start_reach`), and each SDK's punched or relayed channel is joined
to a connection to that path, so the same CurveZMQ session runs over it.
"""
from __future__ import annotations

import collections
import errno
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Optional, Protocol

import orjson
import zmq
from pydantic import TypeAdapter, ValidationError

from endpoint_agent.config import ConfigError, DirectConfig
from endpoint_agent.direct.receipt import DirectReceipt
from endpoint_agent.task_record import T_ID
from skyfn.protocol.api import DirectInfo
from skyfn.protocol.direct import (
    MAX_ASKED, PING, PONG, REFUSE_BAD_PACK, REFUSE_BAD_TOKEN, REFUSE_EXPIRED, REFUSE_FUNCTION, REFUSED, RESULTS, SUBMIT,
    DirectRefused, body_digest, new_session_key, verify_token,
)
from skyfn.protocol.messages import TaskPack, TaskSpec

log = logging.getLogger("skyfn.agent.direct")

MAX_MESSAGE_BYTES = 64 << 20   # a larger message is dropped by ZeroMQ before it is read
MAX_TOKENS = 4096              # verified tokens kept; expired ones go first, then all
MAX_BODIES = 4096              # verified function bodies kept, oldest out first
REPLY_CHUNK = 1000             # results per RESULTS frame at most
DRAIN_MAX = 1000               # messages read per step (the managers' socket gets its turn)
RECENT_MAX = 50_000            # results kept for replay after they were sent ...
RECENT_BYTES = 64 << 20        # ... at most this many bytes of them ...
RECENT_S = 600.0               # ... for at most this long
SEEN_MAX = 200_000             # task ids remembered as received (an id not among them never arrived)

_specs = TypeAdapter(list[TaskSpec])


class IxState(Protocol):
    """What the direct server reads of the interchange's state (IxState,
    endpoint_agent/interchange/state.py). A Protocol, so this package imports nothing of
    the interchange: the interchange owns the server and imports it."""

    functions: dict
    tasks: dict
    direct_replies: dict[bytes, list[dict]]

    def load(self) -> int: ...

    def capacity(self) -> int: ...


class DirectServer:
    def __init__(self, settings: DirectConfig, endpoint_id: str, ctx: zmq.Context, keys: tuple[bytes, bytes]):
        self.endpoint_id = endpoint_id
        self.started = time.time()
        self.session_key = new_session_key()  # a secret: never logged, never in status.json
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unknown identity raises (counted) rather than vanishing
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)   # an SDK that reconnects under its identity takes it over
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        public, secret = keys
        sock.curve_server = True
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        self.settings = settings
        self.port: Optional[int] = None
        self.address: Optional[str] = None
        self.ipc_dir: Optional[str] = None
        try:
            if settings.by_address:
                if settings.port:
                    sock.bind(f"tcp://{settings.listen}:{settings.port}")
                    self.port = settings.port
                else:
                    self.port = sock.bind_to_random_port(f"tcp://{settings.listen}")
                self.address = f"tcp://{settings.advertised_host()}:{self.port}"
        except zmq.ZMQError as exc:
            sock.close(0)
            raise ConfigError(f"direct: cannot listen on {settings.listen} port {settings.port or 'any'} ({exc}); "
                             f"change direct.listen or direct.port in config.yaml (port 0: any free port)") from None
        if settings.by_rendezvous:  # paths through the rendezvous end here: a file, not a port
            self.ipc_dir = tempfile.mkdtemp(prefix="skyfn-direct-")
            sock.bind(f"ipc://{self.ipc_path}")
        self.sock = sock
        self.server_key = public.decode()
        self.reach = None  # the rendezvous side (reach.py), once start_reach ran
        # task id -> (when sent, size, result record, the SDK's identity)
        self.recent: collections.OrderedDict[str, tuple[float, int, dict, bytes]] = collections.OrderedDict()
        self.recent_bytes = 0
        self.replayed = 0
        self.seen: collections.OrderedDict[str, float] = collections.OrderedDict()  # task id -> when received
        self.tokens: dict[str, tuple[float, dict[str, Any]]] = {}  # token -> (expiry, claims)
        self.bodies: dict[tuple[str, str], str] = {}  # (function id, digest) -> verified body
        self.taking = True  # False while the agent stops: packs are refused
        self.packs = 0
        self.tasks = 0
        self.refused = 0
        self.dropped = 0
        log.info("direct sessions on %s%s", f"{self.address} (bound on {settings.listen})" if self.address else "no port",
                 " and through the rendezvous server" if settings.by_rendezvous else "")

    @property
    def ipc_path(self) -> Optional[str]:
        return os.path.join(self.ipc_dir, "s") if self.ipc_dir else None

    def info(self) -> dict[str, Any]:
        """What the heartbeat publishes (DirectInfo): where to connect, the key, the session key,
        whether the agent listens at the rendezvous server."""
        return DirectInfo(address=self.address, server_key=self.server_key, session_key=self.session_key,
                          rendezvous=self.settings.by_rendezvous).model_dump()

    def start_reach(self, ticket: Callable[[], Any]) -> None:
        """LISTEN at the rendezvous server (reach.py); `ticket()` gives the ListenTicket (the
        service signs it: POST /endpoints/{id}/direct/listen)."""
        from endpoint_agent.direct.reach import RendezvousReach

        self.reach = RendezvousReach(self.endpoint_id, self.ipc_path, self.session_key, ticket,
                                     punch_timeout=self.settings.punch_timeout).start()

    def stats(self) -> dict[str, Any]:
        out = {"address": self.address, "packs": self.packs, "tasks": self.tasks, "refused": self.refused,
               "dropped_results": self.dropped, "replayed_results": self.replayed}
        if self.reach is not None:
            out["rendezvous"] = self.reach.stats()
        return out

    # --- in ---------------------------------------------------------------------------
    def drain(self, st: IxState) -> list:
        """Read what SDKs sent; the good packs, as intake entries (receipt, pack, recv_ts)."""
        sock = self.sock
        entries: list = []
        for _ in range(DRAIN_MAX):
            try:
                if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    break
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            identity = frames[0]
            op = frames[1] if len(frames) > 1 else b""
            if op == SUBMIT:
                entry = self.submit(st, identity, frames[2:])
                if entry is not None:
                    entries.append(entry)
            elif op == PING:
                self.pong(st, identity, frames[2] if len(frames) > 2 else b"", entries)
            else:
                self.refuse(identity, [], REFUSE_BAD_PACK, f"unknown op code {op[:8]!r}")
        return entries

    def submit(self, st: IxState, identity: bytes, frames: list[bytes]):
        recv_ts = time.time()
        task_ids: list[str] = []
        try:
            if len(frames) != 2:
                raise DirectRefused(REFUSE_BAD_PACK, f"a SUBMIT is [op, token, pack]: got {len(frames) + 1} frames")
            raw, task_ids = self._raw_pack(frames[1])
            if not self.taking:
                raise DirectRefused(REFUSE_BAD_TOKEN, "the agent is stopping: ask the service for a new session "
                                                      "(after its restart)")
            claims = self.claims(frames[0])
            specs = self._specs(raw)
            bodies = self.check_functions(st, claims["fns"], specs, raw.get("functions") or {})
        except DirectRefused as exc:
            self.refuse(identity, task_ids, exc.code, exc.reason)
            return None
        self.packs += 1
        self.tasks += len(specs)
        self._saw(specs)
        receipt = DirectReceipt(identity, claims["sid"], {s.task_id: s.function_id for s in specs})
        names = claims.get("fnm") or {}  # signed by the service, as a polled pack's function_meta is sent by it
        meta = {fid: {"owner": names[fid][0], "name": names[fid][1]} for fid in bodies if fid in names}
        pack = TaskPack.model_construct(pack_id=f"direct-{claims['sid']}", endpoint_id=self.endpoint_id,
                                        functions=bodies, function_meta=meta, tasks=specs, owner=claims["sub"],
                                        result_upload=None)
        return receipt, pack, recv_ts

    @staticmethod
    def _raw_pack(body: bytes) -> tuple[dict, list[str]]:
        """The pack's JSON and its task ids (what a refusal names)."""
        try:
            raw = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise DirectRefused(REFUSE_BAD_PACK, f"the pack is not JSON ({exc})") from None
        tasks = raw.get("tasks") if isinstance(raw, dict) else None
        if not isinstance(tasks, list) or not tasks:
            raise DirectRefused(REFUSE_BAD_PACK, 'a pack is {"tasks": [TaskSpec, ...], "functions": {id: body}} '
                                                 'with at least one task')
        ids = [t["task_id"] for t in tasks if isinstance(t, dict) and isinstance(t.get("task_id"), str)]
        if not isinstance(raw.get("functions") or {}, dict):
            raise DirectRefused(REFUSE_BAD_PACK, "the pack's functions must map function ids to bodies")
        return raw, ids

    @staticmethod
    def _specs(raw: dict) -> list[TaskSpec]:
        try:
            return _specs.validate_python(raw["tasks"])
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise DirectRefused(REFUSE_BAD_PACK, f"task {where}: {err.get('msg')} ({exc.error_count()} "
                                                 f"problem(s))") from None

    def claims(self, token_frame: bytes) -> dict[str, Any]:
        """The token's claims: verified once per token string, then read from the cache until it expires."""
        token = token_frame.decode(errors="replace")
        now = time.time()
        hit = self.tokens.get(token)
        if hit is not None:
            if hit[0] >= now:
                return hit[1]
            del self.tokens[token]
            raise DirectRefused(REFUSE_EXPIRED, "the session token expired: ask the service for a new session")
        claims = verify_token(self.session_key, token, self.endpoint_id, now)
        fns = claims["fns"]
        if not all(isinstance(d, str) for d in fns.values()):
            raise DirectRefused(REFUSE_BAD_TOKEN, "the session token's function digests are not strings")
        if len(self.tokens) >= MAX_TOKENS:
            self.tokens = {t: v for t, v in self.tokens.items() if v[0] >= now}
            if len(self.tokens) >= MAX_TOKENS:
                self.tokens.clear()
        self.tokens[token] = (float(claims["exp"]), claims)
        return claims

    def check_functions(self, st: IxState, fns: dict[str, str], specs: list[TaskSpec],
                        sent: dict[str, Any]) -> dict[str, str]:
        """The verified body of every function the pack uses; DirectRefused if a function is
        not in the token or a body does not match the token's digest."""
        bodies: dict[str, str] = {}
        for fid, body in sent.items():
            want = fns.get(fid)
            if want is None:
                raise DirectRefused(REFUSE_FUNCTION, f"function {fid} is not in this session's token: open a "
                                                     f"session that names it")
            if not isinstance(body, str):
                raise DirectRefused(REFUSE_BAD_PACK, f"the body of function {fid} is not a string")
            if not self._verified(fid, want, body):
                raise DirectRefused(REFUSE_FUNCTION, f"the body sent for function {fid} does not match the digest "
                                                     f"the service signed (not the registered function)")
            bodies[fid] = body
        for spec in specs:
            fid = spec.function_id
            if fid in bodies:
                continue
            want = fns.get(fid)
            if want is None:
                raise DirectRefused(REFUSE_FUNCTION, f"function {fid} (task {spec.task_id}) is not in this "
                                                     f"session's token: open a session that names it")
            body = self.bodies.get((fid, want))
            if body is None:
                held = st.functions.get(fid)  # the body a polled pack brought, if it is the signed one
                if held is None or not self._verified(fid, want, held):
                    raise DirectRefused(REFUSE_FUNCTION, f"the body of function {fid} was not sent: send it "
                                                         f"in the pack")
                body = held
            bodies[fid] = body
        return bodies

    def _verified(self, fid: str, digest: str, body: str) -> bool:
        key = (fid, digest)
        known = self.bodies.get(key)
        if known is not None:
            return known == body  # one body per digest: comparing is cheaper than hashing
        if body_digest(body) != digest:
            return False
        if len(self.bodies) >= MAX_BODIES:
            del self.bodies[next(iter(self.bodies))]
        self.bodies[key] = body
        return True

    def pong(self, st: IxState, identity: bytes, asked_frame: bytes, entries: list) -> None:
        """PONG {started, load, capacity, unknown, never}: of the asked task ids (a PING may carry
        a JSON list, MAX_ASKED at most) that this agent does not hold -- not pending, running,
        received this step or with a reply about to go -- those whose result it still keeps
        are sent again (RESULTS, first); `never` are those that never arrived (lost on the way:
        the SDK sends them again, safely), `unknown` the rest, which the SDK settles through
        the service."""
        unknown: list[str] = []
        never: list[str] = []
        if asked_frame:
            try:
                asked = orjson.loads(asked_frame)
            except orjson.JSONDecodeError:
                asked = None
            if isinstance(asked, list) and asked:
                held = {t[T_ID] for t in st.tasks.values()}
                for receipt, _, _ in entries:
                    held.update(receipt.functions)
                for recs in st.direct_replies.values():
                    held.update(r["task_id"] for r in recs)
                again = []
                for tid in asked[:MAX_ASKED]:
                    if not isinstance(tid, str) or tid in held:
                        continue
                    kept = self.recent.get(tid)
                    if kept is not None and kept[3] == identity:  # only to the SDK that sent the task
                        again.append(kept[2])
                    elif tid in self.seen:
                        unknown.append(tid)
                    else:
                        never.append(tid)
                if again:  # their replies were lost: again, before the PONG that would call them unknown
                    self.replayed += len(again)
                    for i in range(0, len(again), REPLY_CHUNK):
                        self.send(identity, [RESULTS, orjson.dumps(again[i:i + REPLY_CHUNK])], 0)
        self.send(identity, [PONG, orjson.dumps({"started": self.started, "load": st.load(),
                                                 "capacity": st.capacity(), "unknown": unknown,
                                                 "never": never})], 0)

    # --- out --------------------------------------------------------------------------
    def refuse(self, identity: bytes, task_ids: list[str], code: str, reason: str) -> None:
        self.refused += 1
        log.info("direct pack of %d task(s) refused (%s): %s", len(task_ids), code, reason)
        self.send(identity, [REFUSED, orjson.dumps({"task_ids": task_ids, "reason": reason, "code": code})], 0)

    def flush(self, st: IxState) -> None:
        """Send each SDK the results of this step (st.direct_replies, filled by the ResultBatcher)."""
        replies = st.direct_replies
        st.direct_replies = {}
        for identity, recs in replies.items():
            self._remember(identity, recs)
        for identity, recs in replies.items():
            for i in range(0, len(recs), REPLY_CHUNK):
                chunk = recs[i:i + REPLY_CHUNK] if len(recs) > REPLY_CHUNK else recs
                self.send(identity, [RESULTS, orjson.dumps(chunk)], len(chunk))

    def _saw(self, specs: list) -> None:
        """Remember which task ids arrived (RECENT_S, SEEN_MAX): an asked id never seen is safe to resend."""
        now = time.monotonic()
        seen = self.seen
        for spec in specs:
            seen[spec.task_id] = now
        while seen:
            tid, when = next(iter(seen.items()))
            if len(seen) <= SEEN_MAX and now - when <= RECENT_S:
                break
            seen.popitem(last=False)

    def _remember(self, identity: bytes, recs: list[dict]) -> None:
        """Keep sent results for replay (see the module docstring), within RECENT_*."""
        now = time.monotonic()
        recent = self.recent
        for rec in recs:
            size = sum(len(v) for v in (rec.get("result"), rec.get("error"), rec.get("stdout"), rec.get("stderr"))
                       if isinstance(v, (str, bytes)))
            old = recent.pop(rec["task_id"], None)
            if old is not None:
                self.recent_bytes -= old[1]
            recent[rec["task_id"]] = (now, size, rec, identity)
            self.recent_bytes += size
        while recent:
            first = next(iter(recent.values()))
            if len(recent) <= RECENT_MAX and self.recent_bytes <= RECENT_BYTES and now - first[0] <= RECENT_S:
                break
            self.recent_bytes -= recent.popitem(last=False)[1][1]

    def send(self, identity: bytes, frames: list[bytes], n_results: int) -> None:
        """Never blocks or raises: an SDK gone (EHOSTUNREACH) or not reading (EAGAIN) loses the reply."""
        try:
            self.sock.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.dropped += n_results
            if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN, zmq.EAGAIN):
                log.warning("direct reply to an SDK failed (%s): dropped", exc)

    def close(self, st: IxState) -> None:
        if self.reach is not None:
            self.reach.stop()
        if st.direct_replies:
            self.flush(st)
        self.sock.close(0)
        if self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
