"""The rendezvous server and its pure-Python reference client through the NATs (no
communicator): run in a peer namespace by test_netns.py.

    python -m tests.comm.rdv_probe RENDEZVOUS GROUP SIZE RANK NBYTES

Token from $SKYFN_TEST_TOKEN. Joins, then opens a relay to the other rank (SIZE is 2),
sends NBYTES random bytes through it and reads the other's; prints one JSON line with
the peer table the server sent and the sha256 of what was sent and received.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading

from rendezvous import client


def main(argv: list[str]) -> int:
    address, group, size, rank, nbytes = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    token = os.environ["SKYFN_TEST_TOKEN"]
    session = client.join(address, group, token, size=size, rank=rank, timeout=30)
    out = {"rank": session.rank, "peers": [list(p) for p in session.peers],
           "local_port": session.local_address[1]}
    sock = client.relay(address, group, token, session.rank, 1 - session.rank, timeout=30)
    payload = os.urandom(nbytes)
    sender = threading.Thread(target=sock.sendall, args=(payload,))
    sender.start()
    got = bytearray()
    while len(got) < nbytes:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got += chunk
    sender.join()
    out.update(sent=hashlib.sha256(payload).hexdigest(), received=hashlib.sha256(got).hexdigest(),
               received_bytes=len(got))
    sock.close()
    session.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
