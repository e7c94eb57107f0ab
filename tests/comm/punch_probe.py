"""Plain-socket hole punching, independent of the communicator: checks the NAT topology.

Run inside the topology's namespaces (see test_netns.py):

    python -m tests.comm.punch_probe reflector HOST PORT N
        accepts N peers; tells each the address it saw them from and, once all are
        there, every other peer's observed address (a minimal rendezvous).
    python -m tests.comm.punch_probe peer HOST PORT NAME DEADLINE_S
        binds one local port with SO_REUSEADDR/SO_REUSEPORT, connects to the reflector
        from it, then listens on it and connects from it to the other peer's observed
        address with jittered retries until a connection forms or DEADLINE_S passes;
        exchanges 256 KiB each way and prints one JSON line with what happened.
"""
from __future__ import annotations

import errno
import hashlib
import json
import random
import socket
import sys
import threading
import time

PAYLOAD = 256 * 1024


def _reuse_socket(port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("0.0.0.0", port))
    return s


def _readline(sock: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError(f"connection closed after {buf!r}")
        buf += chunk
    return buf.decode().strip()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(1 << 20, n - got))
        if not chunk:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _payload(name: str) -> bytes:
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (PAYLOAD // len(seed) + 1))[:PAYLOAD]


def reflector(host: str, port: int, n: int) -> None:
    srv = _reuse_socket(port) if host == "0.0.0.0" else socket.create_server((host, port), reuse_port=True)
    srv.listen(n)
    print("listening", flush=True)
    peers = []
    for _ in range(n):
        conn, addr = srv.accept()
        name = _readline(conn)
        conn.sendall(f"YOU {addr[0]} {addr[1]}\n".encode())
        peers.append((name, conn, addr))
    for name, conn, _ in peers:
        for other, _, addr in peers:
            if other != name:
                conn.sendall(f"PEER {other} {addr[0]} {addr[1]}\n".encode())
        conn.sendall(b"END\n")
    for _, conn, _ in peers:  # the peers close first; then we are done
        conn.recv(1)
        conn.close()


def peer(host: str, port: int, name: str, deadline_s: float) -> dict:
    ctl = _reuse_socket()
    local_port = ctl.getsockname()[1]
    ctl.connect((host, port))
    ctl.sendall(f"{name}\n".encode())
    _, my_ip, my_port = _readline(ctl).split()
    others = []
    while (line := _readline(ctl)) != "END":
        _, other, ip, oport = line.split()
        others.append((other, ip, int(oport)))
    (other, ip, oport), = others
    target = (ip, oport)

    listener = _reuse_socket(local_port)
    listener.listen(4)
    listener.settimeout(0.1)
    found: list[tuple[socket.socket, str]] = []
    done = threading.Event()

    def accept_loop() -> None:
        while not done.is_set():
            try:
                conn, addr = listener.accept()
            except socket.timeout:
                continue
            if addr == target and not done.is_set():
                found.append((conn, "accept"))
                done.set()
            else:
                conn.close()

    acceptor = threading.Thread(target=accept_loop, daemon=True)
    acceptor.start()
    attempts, errors = 0, {}
    end = time.monotonic() + deadline_s
    while not done.is_set() and time.monotonic() < end:
        attempts += 1
        s = _reuse_socket(local_port)
        s.settimeout(max(0.05, min(0.5, end - time.monotonic())))
        try:
            s.connect(target)
            if not done.is_set():
                found.append((s, "connect"))
                done.set()
                break
            s.close()
        except OSError as e:
            s.close()
            code = errno.errorcode.get(e.errno, type(e).__name__) if e.errno else type(e).__name__
            errors[code] = errors.get(code, 0) + 1
            # EADDRNOTAVAIL: the listener already holds this address pair; the acceptor has it.
            time.sleep(random.uniform(0.01, 0.08))
    done.set()
    acceptor.join()
    result = {"name": name, "observed": [my_ip, int(my_port)], "peer_public": [ip, oport],
              "local_port": local_port, "attempts": attempts, "errors": errors, "ok": False}
    if found:
        conn, via = found[0]
        conn.settimeout(10)
        conn.sendall(f"{name}\n".encode() + _payload(name))
        their = _readline(conn)
        data = _recv_exact(conn, PAYLOAD)
        result.update(ok=True, via=via, peername=list(conn.getpeername()), their_name=their,
                      payload_ok=(their == other and data == _payload(other)))
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
        conn.close()
    ctl.close()
    return result


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "reflector":
        reflector(argv[1], int(argv[2]), int(argv[3]))
    elif mode == "peer":
        print(json.dumps(peer(argv[1], int(argv[2]), argv[3], float(argv[4]))), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}: use reflector or peer")


if __name__ == "__main__":
    main(sys.argv[1:])
