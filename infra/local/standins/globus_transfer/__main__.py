"""`python -m infra.local.standins.globus_transfer`: serve the Globus Transfer stand-in (usage in the
package's docstring)."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

from infra.local.standins import globus_transfer
from infra.local.standins.globus_transfer.server import TransferStandIn


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.local.standins.globus_transfer",
                                 description=globus_transfer.__doc__.split("\n\n")[0])
    ap.add_argument("--collection", action="append", default=[], metavar="ID=DIR", required=True,
                    help="a collection: its id and the directory its '/' maps to (repeat)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8600)
    ap.add_argument("--token", action="append", default=None, metavar="TOKEN",
                    help="a bearer token to accept (repeat); none given: any token is accepted")
    ap.add_argument("--refresh-token", action="append", default=[], metavar="TOKEN",
                    help="a refresh token the token endpoint accepts (repeat)")
    ap.add_argument("--auth-code", action="append", default=[], metavar="CODE",
                    help="a one-time authorization code a login flow may exchange (repeat)")
    ap.add_argument("--client", action="append", default=[], metavar="ID=SECRET",
                    help="a confidential client for client credentials (repeat)")
    ap.add_argument("--copy-delay", type=float, default=0.0, help="seconds each task waits before copying")
    ap.add_argument("--log", default=None, metavar="FILE", help="keep the task log in this JSON file too")
    args = ap.parse_args(argv)
    collections = {}
    for spec in args.collection:
        cid, sep, directory = spec.partition("=")
        if not sep or not cid or not directory:
            ap.error(f"--collection {spec!r}: expected ID=DIR")
        collections[cid] = directory
    clients = {}
    for spec in args.client:
        cid, sep, secret = spec.partition("=")
        if not sep:
            ap.error(f"--client {spec!r}: expected ID=SECRET")
        clients[cid] = secret
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = TransferStandIn(collections, host=args.host, port=args.port,
                             tokens=set(args.token) if args.token else None, clients=clients,
                             refresh_tokens=set(args.refresh_token), auth_codes=set(args.auth_code),
                             copy_delay=args.copy_delay, log_file=args.log)
    print(f"Globus Transfer stand-in on {server.url} ({len(collections)} collection(s)); "
          f"export GLOBUS_SDK_SERVICE_URL_TRANSFER={server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
