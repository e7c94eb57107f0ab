"""The peer-ref broker with real accounts (issue 23; DESIGN.md section 12): a ref alice shares
with bob resolves in bob's process through alice's broker, which takes bob's identity from the
kernel (SO_PEERCRED) and checks the capability with alice's store secret; bob gets none of
alice's credentials and cannot reach her Redis. Accounts are made with `useradd -m` and removed
afterwards; their processes run /usr/bin/python3 on the `shared_python` copy.

The last tests run without accounts: the broker in the agent's data plane (its start and stop,
a stale socket replaced) and its answers to malformed, unknown and unauthorized requests."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from endpoint_agent.multiuser.accounts import account_environment, lookup_account, prepare_workdir, start_as
from skyfn.data import codec
from skyfn.protocol.peer_refs import PEER_IDENTITIES_ENV, PEER_REFS_DIR_ENV, encode_line, socket_name, socket_path
from tests.multiuser import LocalAccounts

REDIS = shutil.which("redis-server")
as_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not REDIS,
                             reason="accounts, processes as them and their redis-server need root, useradd and "
                                    "redis-server")

ALICE_REDIS_CONF = r"""
import os, secrets, sys
workdir, port = sys.argv[1], sys.argv[2]
password = secrets.token_hex(24)
fd = os.open(os.path.join(workdir, "redis.password"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, password.encode()); os.close(fd)
fd = os.open(os.path.join(workdir, "redis.conf"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, "\n".join([f"port {port}", "bind 127.0.0.1", f"requirepass {password}", 'save ""', "appendonly no",
                        f"dir {workdir}", "protected-mode yes", f"logfile {workdir}/redis.log"]).encode() + b"\n")
os.close(fd)
"""

# As alice: her store on her Redis, its stores file (0600, the secret), and refs: shared with bob
# and carol, her own, used once, a forged and an expired capability. Prints them pickled.
ALICE_PRODUCE = r"""
import base64, hashlib, json, os, pickle, secrets, sys, time
from skyfn.data import capability, context
from skyfn.data.connectors.redis import RedisConnector
from skyfn.data.ref import Ref, RefInfo, ref_info
from skyfn.data.store import Store, write_stores_file
cfg = json.loads(sys.argv[1])
deadline = time.time() + 30
while True:
    try:
        conn = RedisConnector(port=cfg["port"], password_file=os.path.join(cfg["workdir"], "redis.password"),
                              chunk_bytes=1 << 20)
        conn.client.ping()
        break
    except Exception:
        if time.time() > deadline:
            raise
        time.sleep(0.1)
secret = secrets.token_bytes(32)
store = Store(cfg["store"], conn, secret=secret, endpoint_id="ep-alice")
write_stores_file(os.path.join(cfg["workdir"], "stores.json"),
                  {cfg["store"]: {"connector": conn.config(), "secret": secret.hex()}}, cfg["store"], "ep-alice")
context.set_user(cfg["alice"])
def value(text):
    return {"text": text, "blob": os.urandom(3 << 20)}   # 3 MiB: chunked in Redis, many reads on the socket
def out(ref, v=None):
    info = ref_info(ref)
    return {"ref": base64.b64encode(pickle.dumps(ref)).decode(), "key": info.key, "cap": info.capability,
            "value": v and {"text": v["text"], "blob": hashlib.sha256(v["blob"]).hexdigest()}}
refs = {}
v = value("shared with bob and carol")
refs["shared"] = out(store.ref(v, ttl=600, share_with=[cfg["bob"], cfg["carol"]]), v)
v = value("alice's own")
private = store.ref(v, ttl=600)
refs["private"] = out(private, v)
v = value("used once")
refs["once"] = out(store.ref(v, ttl=600, share_with=[cfg["bob"]], evict=True), v)
p = ref_info(private)
forged = capability.sign(secrets.token_bytes(32), p.store, p.key, cfg["alice"], [cfg["bob"]])   # not alice's secret
refs["forged"] = out(Ref(RefInfo(p.store, p.connector, p.key, forged, p.endpoint_id, p.size)))
expired = capability.sign(secret, p.store, p.key, cfg["alice"], [cfg["bob"]], time.time() - 60)
refs["expired"] = out(Ref(RefInfo(p.store, p.connector, p.key, expired, p.endpoint_id, p.size)))
print(json.dumps(refs))
"""

# As bob or carol: each action of the JSON list on stdin, its outcome (or the error) in the list printed.
CLIENT = r"""
import base64, hashlib, json, os, pickle, socket, sys
from skyfn.data import context, peer
from skyfn.data.ref import ref_info
def load(text):
    return pickle.loads(base64.b64decode(text))
out = []
for act in json.load(sys.stdin):
    do = act["do"]
    try:
        if do == "resolve":
            context.set_user(act.get("user"))
            obj = load(act["ref"]).__wrapped__
            out.append({"ok": True, "value": {"text": obj["text"], "blob": hashlib.sha256(obj["blob"]).hexdigest()}})
        elif do == "exists":
            out.append({"ok": True, "exists": peer.exists(ref_info(load(act["ref"])))})
        elif do == "raw":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            s.connect(act["path"])
            s.sendall(json.dumps(act["request"]).encode() + b"\n")
            out.append({"ok": True, "reply": json.loads(peer.LineReader(s).line())})
        elif do == "redis":
            import redis
            client = redis.Redis(port=act["port"], password=act.get("password"), socket_timeout=10)
            client.get("skyfn:d:" + act["key"])
            out.append({"ok": True})
        elif do == "read":
            open(act["path"], "rb").read()
            out.append({"ok": True})
        elif do == "bind":
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(act["path"])
            out.append({"ok": True})
        elif do == "unlink":
            os.unlink(act["path"])
            out.append({"ok": True})
    except Exception as exc:
        out.append({"ok": False, "error": type(exc).__name__, "classes": [c.__name__ for c in type(exc).__mro__],
                    "message": str(exc)})
print(json.dumps(out))
"""

# As bob: a socket under alice's store name in his own directory, serving a fake object to whoever asks.
SQUATTER = r"""
import json, os, socket, sys
from skyfn.data import codec
path = sys.argv[1]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(path)
os.chmod(path, 0o666)
sock.listen(16)
print(json.dumps({"listening": path}), flush=True)
fake = codec.encode({"text": "squatted", "blob": b"bob's"})
while True:
    conn, _ = sock.accept()
    try:
        conn.settimeout(5)
        if conn.recv(65536):
            conn.sendall(json.dumps({"ok": True, "size": len(fake)}).encode() + b"\n" + fake)
    except OSError:
        pass
    conn.close()
"""


def _wait_line(proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no ready line within {timeout} s (exit code {proc.poll()})"
    line = proc.stdout.readline()
    assert line, f"the process exited ({proc.wait(10)}) before its ready line"
    return json.loads(line)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def scene(request):
    """alice (her redis-server, her store with refs, her broker, all as alice), bob and carol."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not REDIS:
        pytest.skip("accounts, processes as them and their redis-server need root, useradd and redis-server")
    python, pythonpath = request.getfixturevalue("shared_python")
    accounts = LocalAccounts()
    base = Path(tempfile.mkdtemp(prefix="skyfn-peer-"))
    procs: list[subprocess.Popen] = []
    try:
        base.chmod(0o755)
        alice, bob, carol = (lookup_account(accounts.user()) for _ in range(3))
        ids = {a.name: f"user-{a.name}" for a in (alice, bob, carol)}
        peer_dir = base / "p"                      # root's, 0755; one directory per account, the account's, 0755
        peer_dir.mkdir(mode=0o755)
        for a in (alice, bob, carol):
            d = peer_dir / a.name
            d.mkdir(mode=0o755)
            os.chown(d, a.uid, a.gid)
            d.chmod(0o755)
        identities = base / "peer-identities.json"
        identities.write_text(json.dumps({str(a.uid): [ids[a.name]] for a in (alice, bob, carol)}))
        identities.chmod(0o644)
        extra = {"PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1", PEER_REFS_DIR_ENV: str(peer_dir),
                 PEER_IDENTITIES_ENV: str(identities)}
        env = {a.name: account_environment(a, extra) for a in (alice, bob, carol)}
        wd = {a.name: prepare_workdir(a, "{home}/skyfn") for a in (alice, bob, carol)}

        def run_as(account, argv, stdin=None):
            proc = start_as(account, argv, workdir=wd[account.name], environment=env[account.name],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = proc.communicate(stdin, timeout=180)
            assert proc.returncode == 0, f"{argv[:3]} as {account.name}: {err.decode(errors='replace')}"
            return json.loads(out) if out.strip() else None

        def client(account, actions):
            return run_as(account, [python, "-c", CLIENT], json.dumps(actions).encode())

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        alice_wd = wd[alice.name]
        run_as(alice, [python, "-c", ALICE_REDIS_CONF, str(alice_wd), str(port)])
        redis_proc = start_as(alice, [REDIS, str(alice_wd / "redis.conf")], workdir=alice_wd,
                              environment=env[alice.name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        procs.append(redis_proc)
        store = "redis@ep-alice"
        refs = run_as(alice, [python, "-c", ALICE_PRODUCE, json.dumps(
            {"workdir": str(alice_wd), "port": port, "store": store, "alice": ids[alice.name],
             "bob": ids[bob.name], "carol": ids[carol.name]})])
        broker_log = base / "broker.log"
        with open(broker_log, "wb") as logf:
            broker = start_as(alice, [python, "-m", "endpoint_agent.data.ref_broker", "--stores-file",
                                      str(alice_wd / "stores.json")], workdir=alice_wd, environment=env[alice.name],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=logf)
        procs.append(broker)
        ready = _wait_line(broker)
        yield SimpleNamespace(alice=alice, bob=bob, carol=carol, ids=ids, peer_dir=peer_dir, store=store, port=port,
                              refs=refs, broker=broker, ready=ready, broker_log=broker_log, redis=redis_proc,
                              alice_socket=socket_path(str(peer_dir), alice.name, store), workdir=wd,
                              client=client, run_as=run_as, python=python, env=env, procs=procs)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        accounts.remove_all()
        shutil.rmtree(base, ignore_errors=True)


def _status_uids(pid: int) -> list[str]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return status["Uid"].split()


@as_root
def test_alices_broker_runs_as_alice_and_binds_her_socket_open_to_every_account(scene):
    assert scene.ready["sockets"] == [scene.alice_socket]
    assert Path(scene.alice_socket).name == socket_name(scene.store)
    st = os.lstat(scene.alice_socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666 and st.st_uid == scene.alice.uid
    assert _status_uids(scene.broker.pid) == [str(scene.alice.uid)] * 4
    assert _status_uids(scene.redis.pid) == [str(scene.alice.uid)] * 4
    password_file = scene.workdir[scene.alice.name] / "redis.password"
    pst = os.stat(password_file)
    assert (pst.st_uid, stat.S_IMODE(pst.st_mode)) == (scene.alice.uid, 0o600)


@as_root
def test_bob_resolves_the_ref_alice_shared_with_him_and_bytes_only_once_for_a_use_once_ref(scene):
    shared, once = scene.refs["shared"], scene.refs["once"]
    bob = scene.ids[scene.bob.name]
    got = scene.client(scene.bob, [
        {"do": "resolve", "ref": shared["ref"], "user": bob},
        {"do": "resolve", "ref": shared["ref"], "user": bob},       # a cache hit, checked again against bob
        {"do": "resolve", "ref": shared["ref"]},                    # no task user: the broker decides by uid
        {"do": "exists", "ref": shared["ref"]},
        {"do": "resolve", "ref": once["ref"], "user": bob},
        {"do": "exists", "ref": once["ref"]},
        {"do": "resolve", "ref": once["ref"], "user": bob},
    ])
    assert got[0] == {"ok": True, "value": shared["value"]}, got[0]
    assert got[1] == got[2] == got[0]
    assert got[3] == {"ok": True, "exists": True}
    assert got[4] == {"ok": True, "value": once["value"]}, got[4]
    assert got[5] == {"ok": True, "exists": False}
    assert not got[6]["ok"] and got[6]["error"] == "RefResolutionError"
    assert "no such object" in got[6]["message"] and "evict=True resolves once" in got[6]["message"]


@as_root
def test_bob_is_refused_what_is_not_shared_with_him_forged_or_expired_with_the_reason(scene):
    bob = scene.ids[scene.bob.name]
    alice = scene.ids[scene.alice.name]
    private = scene.refs["private"]
    got = scene.client(scene.bob, [
        {"do": "resolve", "ref": private["ref"], "user": bob},
        {"do": "resolve", "ref": private["ref"]},
        {"do": "raw", "path": scene.alice_socket,   # claiming to be alice in the request changes nothing
         "request": {"v": 1, "op": "get", "store": scene.store, "key": private["key"], "cap": private["cap"],
                     "user": alice}},
        {"do": "resolve", "ref": scene.refs["forged"]["ref"], "user": bob},
        {"do": "resolve", "ref": scene.refs["expired"]["ref"], "user": bob},
        {"do": "exists", "ref": private["ref"]},
    ])
    for outcome in got[:2] + got[3:]:
        assert not outcome["ok"] and outcome["error"] == "RefAccessDenied", outcome
        assert "RefResolutionError" in outcome["classes"]
    assert f"it belongs to {alice} and is not shared with {bob}" in got[0]["message"]
    assert (f"it belongs to {alice} and is not shared with {bob} (uid {scene.bob.uid})" in got[1]["message"]
            and f"refused by the peer-ref broker of account {scene.alice.name}" in got[1]["message"])
    assert got[2]["reply"]["ok"] is False and got[2]["reply"]["code"] == "denied"
    assert f"not shared with {bob} (uid {scene.bob.uid})" in got[2]["reply"]["reason"]
    assert "not signed by this store (forged, altered" in got[3]["message"]
    assert "the ref expired at" in got[4]["message"]
    assert f"not shared with {bob}" in got[5]["message"]
    log = scene.broker_log.read_text()
    assert "refused" in log and "served" in log
    for ref in scene.refs.values():                 # capabilities never reach the log
        assert ref["cap"] not in log and ref["cap"].split(".")[1] not in log


@as_root
def test_bob_cannot_reach_alices_redis_or_her_password(scene):
    key = scene.refs["shared"]["key"]
    password_file = scene.workdir[scene.alice.name] / "redis.password"
    got = scene.client(scene.bob, [
        {"do": "redis", "port": scene.port, "key": key},
        {"do": "redis", "port": scene.port, "key": key, "password": "guessed"},
        {"do": "read", "path": str(password_file)},
        {"do": "read", "path": str(scene.workdir[scene.alice.name] / "stores.json")},
    ])
    assert not got[0]["ok"] and "AuthenticationError" in got[0]["classes"], got[0]
    assert "authenticat" in got[0]["message"].lower()   # NOAUTH (redis-py 8 says it of its HELLO)
    assert not got[1]["ok"] and "AuthenticationError" in got[1]["classes"], got[1]
    assert "invalid username-password pair" in got[1]["message"] or "WRONGPASS" in got[1]["message"]
    assert got[2]["error"] == got[3]["error"] == "PermissionError"


@as_root
def test_no_squatter_is_trusted_in_alices_directory_or_under_her_store_name_in_its_own(scene):
    alice_dir = scene.peer_dir / scene.alice.name
    bob_squat = str(scene.peer_dir / scene.bob.name / socket_name(scene.store))
    got = scene.client(scene.bob, [
        {"do": "bind", "path": str(alice_dir / "mine.sock")},
        {"do": "unlink", "path": scene.alice_socket},
    ])
    assert [g["error"] for g in got] == ["PermissionError", "PermissionError"], got
    squatter = start_as(scene.bob, [scene.python, "-c", SQUATTER, bob_squat], workdir=scene.workdir[scene.bob.name],
                        environment=scene.env[scene.bob.name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL)
    scene.procs.append(squatter)
    assert _wait_line(squatter) == {"listening": bob_squat}
    shared = scene.refs["shared"]
    carol = scene.ids[scene.carol.name]
    # alice's broker is up: carol gets alice's object, whatever bob's socket says
    got = scene.client(scene.carol, [{"do": "resolve", "ref": shared["ref"], "user": carol}])
    assert got == [{"ok": True, "value": shared["value"]}]

    _stop(scene.broker)                              # alice's agent goes away: her broker removes its socket
    assert scene.broker.returncode == 0
    assert not os.path.lexists(scene.alice_socket)
    got = scene.client(scene.carol, [{"do": "resolve", "ref": shared["ref"], "user": carol}])
    outcome = got[0]
    assert not outcome["ok"] and outcome["error"] == "RefResolutionError", outcome
    assert f"the socket {bob_squat} is served by uid {scene.bob.uid}" in outcome["message"]
    assert f"not the ref's owner {scene.ids[scene.alice.name]}: not trusted" in outcome["message"]

    # a server of another uid in alice's directory (only root can put one there): refused by the directory check
    fake = codec.encode({"text": "squatted", "blob": b"root's"})
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(scene.alice_socket)
    os.chmod(scene.alice_socket, 0o666)
    listener.listen(4)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    if conn.recv(65536):
                        conn.sendall(encode_line({"ok": True, "size": len(fake)}) + fake)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        got = scene.client(scene.carol, [{"do": "resolve", "ref": shared["ref"], "user": carol}])
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        os.unlink(scene.alice_socket)
    outcome = got[0]
    assert not outcome["ok"] and outcome["error"] == "RefResolutionError", outcome
    assert (f"the socket {scene.alice_socket} is served by uid 0, but the account directory {alice_dir} belongs to "
            f"uid {scene.alice.uid}: not trusted (a squatter)") in outcome["message"]
    assert "squatted" not in json.dumps(got)


# ---- without accounts: the broker in the data plane, and its answers ---------------------------------

@pytest.fixture
def peer_env(tmp_path, monkeypatch):
    """SKYFN_PEER_REFS_DIR with this account's directory, and an identities file naming our uid "me"."""
    import pwd

    from skyfn.data import context

    base = Path(tempfile.mkdtemp(prefix="sfpr-"))      # short: the socket path limit
    account = pwd.getpwuid(os.geteuid()).pw_name
    (base / "p" / account).mkdir(parents=True, mode=0o755)
    ids = base / "ids.json"
    ids.write_text(json.dumps({str(os.geteuid()): ["me"]}))
    ids.chmod(0o644)
    monkeypatch.setenv(PEER_REFS_DIR_ENV, str(base / "p"))
    monkeypatch.setenv(PEER_IDENTITIES_ENV, str(ids))
    monkeypatch.setenv("SKYFN_DATA_STORES", "")
    # EndpointData (run in this process here) sets both: restored after the test, so later tests of
    # this process do not believe they run on endpoint ep1 (a direct store then refuses local puts)
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "")
    context.set_user("me")
    try:
        yield SimpleNamespace(dir=base / "p", account=account, ids=ids, base=base)
    finally:
        context.set_user(None)
        shutil.rmtree(base, ignore_errors=True)


def _write_ids(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.chmod(0o644)
    os.replace(tmp, path)


def test_the_data_plane_runs_the_broker_replacing_a_stale_socket_and_removes_it_on_stop(peer_env, tmp_path,
                                                                                         monkeypatch):
    from endpoint_agent.data.config import DataConfig
    from endpoint_agent.data.plane import EndpointData
    from skyfn.data import peer
    from skyfn.data import store as store_mod
    from skyfn.data.ref import ref_info

    name = "scratch@ep1"
    path = socket_path(str(peer_env.dir), peer_env.account, name)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)                                  # a previous run's socket file, no one listening
    stale.close()
    cfg = DataConfig.model_validate({"stores": {"scratch": {"connector": "file", "directory": str(tmp_path / "o")}}})
    plane = EndpointData(cfg, tmp_path / "ep", "ep1").start()
    try:
        assert plane.broker is not None and plane.broker.sockets == [path]
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
        producer = store_mod.load_stores_file(str(plane.stores_file))[0]
        ref = producer.ref({"n": list(range(1000))}, share_with=["friend"])
        monkeypatch.setenv("SKYFN_DATA_STORES", "")    # a process that does not know the store: the peer path
        assert store_mod.get_store(name) is None and peer.serves(name)
        assert store_mod.resolve_ref(ref_info(ref)) == {"n": list(range(1000))}
        assert plane.broker.stats["served"] == 1
        info = ref_info(producer.ref("bye", evict=True))
        assert store_mod.resolve_ref(info) == "bye"
        with pytest.raises(store_mod.RefResolutionError, match="no such object"):
            store_mod.resolve_ref(info)
    finally:
        plane.stop()
    assert not os.path.lexists(path)
    with pytest.raises(store_mod.RefResolutionError, match="is not known in this process"):
        store_mod.resolve_ref(ref_info(ref))


def test_a_missing_account_directory_does_not_stop_the_plane_and_says_what_to_fix(peer_env, tmp_path, caplog):
    from endpoint_agent.data.config import DataConfig
    from endpoint_agent.data.plane import EndpointData

    shutil.rmtree(peer_env.dir / peer_env.account)
    cfg = DataConfig.model_validate({"stores": {"scratch": {"connector": "file", "directory": str(tmp_path / "o")}}})
    with caplog.at_level("ERROR", logger="skyfn.agent.data"):
        plane = EndpointData(cfg, tmp_path / "ep", "ep1").start()
    try:
        assert plane.broker is None and plane.stores_file.exists()
        assert f"{peer_env.dir / peer_env.account} does not exist; the multi-user endpoint creates it" in caplog.text
    finally:
        plane.stop()


def test_the_broker_answers_by_uid_rereads_the_identities_and_refuses_with_the_reason(peer_env, tmp_path):
    from endpoint_agent.data.ref_broker import RefBroker
    from skyfn.data.connectors.file import FileConnector
    from skyfn.data.store import Store

    secret = os.urandom(32)
    store = Store("files@ep2", FileConnector(str(tmp_path / "o")), secret=secret, register=False)
    stores = {store.name: {"connector": store.connector.config(), "secret": secret.hex()}}
    with RefBroker(stores, str(peer_env.dir), str(peer_env.ids), max_connections=1) as broker:
        from skyfn.data import context
        from skyfn.data.ref import ref_info

        context.set_user("owner")
        info = ref_info(store.ref([1, 2, 3], share_with=["friend"]))
        req = {"v": 1, "op": "get", "store": store.name, "key": info.key, "cap": info.capability}

        def ask(uid, **change):
            return broker.handle(json.dumps({**req, **change}).encode(), uid)

        head, _ = ask(4242)
        assert head["code"] == "denied" and "not shared with uid 4242, which runs no skyfn user" in head["reason"]
        _write_ids(peer_env.ids, {str(os.geteuid()): ["me"], "4242": ["friend"]})   # re-read: it changed
        head, data = ask(4242)
        assert head == {"ok": True, "size": len(data)} and codec.decode(data) == [1, 2, 3]
        assert ask(4242, op="exists")[0] == {"ok": True, "exists": True}
        assert ask(4242, key="nope")[0]["code"] == "denied"          # the capability is for another key
        assert "not signed by this store" in ask(4242, key="nope")[0]["reason"]
        missing = store.ref("gone", share_with=["friend"])
        store.evict(ref_info(missing).key)
        head, _ = ask(4242, key=ref_info(missing).key, cap=ref_info(missing).capability)
        assert head["code"] == "missing" and "no such object in store files@ep2" in head["reason"]
        assert ask(4242, store="other@ep")[0] == {"ok": False, "code": "invalid", "reason": (
            f"the peer-ref broker of account {peer_env.account} does not serve store 'other@ep'")}
        assert "speaks protocol 1" in ask(4242, v=7)[0]["reason"]
        assert "op must be one of get, exists" in ask(4242, op="evict")[0]["reason"]
        assert "cap must be a non-empty string" in ask(4242, cap=None)[0]["reason"]
        assert broker.handle(b"{not json", 4242)[0]["code"] == "invalid"

        # bounded: with one connection held, the next one is answered busy
        path = broker.sockets[0]
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.connect(path)
        held.sendall(encode_line({**req, "op": "exists"}))
        reply = json.loads(held.recv(4096))     # over the socket the uid is the kernel's: ours runs "me"
        assert reply["code"] == "denied" and f"not shared with me (uid {os.geteuid()})" in reply["reason"]
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.settimeout(10)
        other.connect(path)
        assert json.loads(other.recv(4096))["code"] == "busy"
        other.close()
        held.close()

    _write_ids(peer_env.ids, {str(os.geteuid()): ["me"]})
    os.chmod(peer_env.ids, 0o666)
    from skyfn.data.peer import identities

    with pytest.raises(ValueError, match=r"writable by group or others \(mode 0666\): it is not trusted \(chmod 0644"):
        identities(str(peer_env.ids)).users_of(0)


def test_socket_paths_are_checked_against_the_unix_limit():
    assert socket_name("redis@ep") == socket_name("redis@ep") and len(socket_name("x")) == 24 + len(".sock")
    with pytest.raises(ValueError, match="more than the 107 a Unix socket path may have: set SKYFN_PEER_REFS_DIR"):
        socket_path("/" + "d" * 100, "alice", "redis@ep")
