"""The rendezvous wire protocol (docs/comm.md): parsing and formatting of its text lines.

Peers send JOIN / RELAY (first line of a connection), then BARRIER / RESULT / BYE.
The server answers WELCOME, PEERS + PEER lines, BARRIER_OK, RELAYED or ERROR.
Object servers (the data plane's direct connector) hold a LISTEN <name> connection (then
PING / BYE; the server answers LISTENING, PONG and INCOMING <group> <token> per call); a
consumer's CALL <name> is answered CALLED <group> <token>, a fresh 2-rank group both join.
A direct session's SDK calls an agent with `CALL <name> <call token> <caller>`: the token is
made for that caller (tokens.make_call_token) and the listener's INCOMING names it.
`parse_peer_line` validates one line from a peer and raises ProtocolError with the wire
error code; `parse_server_line` is the client-side counterpart.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple, Union

from .tokens import GROUP_RE

MAX_LINE = 1024            # bytes, the terminating newline included
MAX_GROUP_SIZE = 65536
MAX_EPOCH = 2 ** 63 - 1

# Error codes (docs/comm.md).
BAD_TOKEN = "bad_token"
EXPIRED_TOKEN = "expired_token"
MALFORMED = "malformed"
SIZE_MISMATCH = "size_mismatch"
RANK_TAKEN = "rank_taken"
RANK_OUT_OF_RANGE = "rank_out_of_range"
GROUP_FULL = "group_full"
TIMEOUT = "timeout"
PEER_LOST = "peer_lost"
BUSY = "busy"
NAME_TAKEN = "name_taken"
NO_LISTENER = "no_listener"

# Listener names: group ids short enough that "<name>@<16 hex digits>" is still a group id.
MAX_NAME = 110


class ProtocolError(Exception):
    """A line that breaks the protocol; `code` and `reason` go into the ERROR line."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class Join(NamedTuple):
    group: str
    token: str
    size: int
    rank: int          # -1 = any free rank


class Relay(NamedTuple):
    group: str
    token: str
    my_rank: int
    peer_rank: int


class Barrier(NamedTuple):
    epoch: int


class Result(NamedTuple):
    peer_rank: int
    mode: str          # "direct" | "relay"


class Bye(NamedTuple):
    pass


class Listen(NamedTuple):
    name: str
    token: str         # a group token for <name>


class Call(NamedTuple):
    name: str
    token: str         # a group token for <name>, or a call token for (<name>, <caller>)
    caller: str = ""   # "" : any holder of the name's token


class Ping(NamedTuple):
    pass


PeerMessage = Union[Join, Relay, Barrier, Result, Bye, Listen, Call, Ping]


def _int(text: str, what: str, lo: int, hi: int) -> int:
    body = text[1:] if text.startswith("-") else text
    if not body.isdigit() or len(body) > 20 or not body.isascii():
        # The value is not echoed: in a misordered line it may be the token.
        raise ProtocolError(MALFORMED, f"{what} must be an integer (got {len(text)} other characters)")
    value = int(text)
    if not lo <= value <= hi:
        raise ProtocolError(MALFORMED, f"{what} must be in [{lo}, {hi}], got {value}")
    return value


def _group(text: str) -> str:
    if not GROUP_RE.fullmatch(text):
        raise ProtocolError(MALFORMED, f"group id is invalid ({len(text)} characters): use 1-128 "
                                       "characters of A-Z a-z 0-9 . _ : @ -")
    return text


def _name(text: str) -> str:
    if len(text) > MAX_NAME or not GROUP_RE.fullmatch(text):
        raise ProtocolError(MALFORMED, f"listener name is invalid ({len(text)} characters): use 1-{MAX_NAME} "
                                       "characters of A-Z a-z 0-9 . _ : @ -")
    return text


def _decode(raw: bytes) -> str:
    """A line without its newline (and an optional carriage return) as text."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(MALFORMED, "line is not ASCII text") from None


def parse_peer_line(raw: bytes) -> PeerMessage:
    """Parse one line a peer sent (without its newline)."""
    fields = _decode(raw).split(" ")
    verb = fields[0]
    n = len(fields)
    if verb == "JOIN":
        if n != 5:
            raise ProtocolError(MALFORMED, "expected 'JOIN <group> <token> <size> <rank|-1>'")
        size = _int(fields[3], "size", 1, MAX_GROUP_SIZE)
        rank = _int(fields[4], "rank", -1, MAX_GROUP_SIZE)
        return Join(_group(fields[1]), fields[2], size, rank)
    if verb == "BARRIER":
        if n != 2:
            raise ProtocolError(MALFORMED, "expected 'BARRIER <epoch>'")
        return Barrier(_int(fields[1], "epoch", 0, MAX_EPOCH))
    if verb == "RELAY":
        if n != 5:
            raise ProtocolError(MALFORMED, "expected 'RELAY <group> <token> <my_rank> <peer_rank>'")
        me = _int(fields[3], "my_rank", 0, MAX_GROUP_SIZE - 1)
        other = _int(fields[4], "peer_rank", 0, MAX_GROUP_SIZE - 1)
        if me == other:
            raise ProtocolError(MALFORMED, f"RELAY names rank {me} as both ends")
        return Relay(_group(fields[1]), fields[2], me, other)
    if verb == "RESULT":
        if n != 3 or fields[2] not in ("direct", "relay"):
            raise ProtocolError(MALFORMED, "expected 'RESULT <peer_rank> direct|relay'")
        return Result(_int(fields[1], "peer_rank", 0, MAX_GROUP_SIZE - 1), fields[2])
    if verb == "BYE":
        if n != 1:
            raise ProtocolError(MALFORMED, "expected 'BYE'")
        return Bye()
    if verb == "LISTEN":
        if n != 3:
            raise ProtocolError(MALFORMED, "expected 'LISTEN <name> <token>'")
        return Listen(_name(fields[1]), fields[2])
    if verb == "CALL":
        if n not in (3, 4):
            raise ProtocolError(MALFORMED, "expected 'CALL <name> <token> [<caller>]'")
        return Call(_name(fields[1]), fields[2], _group(fields[3]) if n == 4 else "")
    if verb == "PING":
        if n != 1:
            raise ProtocolError(MALFORMED, "expected 'PING'")
        return Ping()
    shown = repr(verb) if len(verb) <= 12 else f"of {len(verb)} characters"
    raise ProtocolError(MALFORMED, f"unknown command {shown}: expected JOIN, RELAY, BARRIER, RESULT, BYE, "
                                   "LISTEN, CALL or PING")


# ---- server -> peer -------------------------------------------------------------------

def welcome(rank: int, size: int) -> bytes:
    return b"WELCOME %d %d\n" % (rank, size)


def peers(addresses: Sequence[Tuple[str, int]]) -> bytes:
    """PEERS <n> then one PEER line per rank, in rank order."""
    lines = [b"PEERS %d\n" % len(addresses)]
    lines += [b"PEER %d %s %d\n" % (r, ip.encode(), port) for r, (ip, port) in enumerate(addresses)]
    return b"".join(lines)


def barrier_ok(epoch: int) -> bytes:
    return b"BARRIER_OK %d\n" % epoch


RELAYED = b"RELAYED\n"
PONG = b"PONG\n"


def listening(name: str) -> bytes:
    return b"LISTENING %s\n" % name.encode()


def incoming(group: str, token: str, caller: str = "") -> bytes:
    """To a listener: a consumer called; join <group> as rank 0 with <token>. A caller
    admitted by a call token is named (the service vouches for it: tokens.make_call_token)."""
    if caller:
        return b"INCOMING %s %s %s\n" % (group.encode(), token.encode(), caller.encode())
    return b"INCOMING %s %s\n" % (group.encode(), token.encode())


def called(group: str, token: str) -> bytes:
    """To a caller: join <group> as rank 1 with <token>; the listener joins as rank 0."""
    return b"CALLED %s %s\n" % (group.encode(), token.encode())


def error(code: str, reason: str) -> bytes:
    text = " ".join(reason.split())  # one line, whatever the reason contained
    line = f"ERROR {code} {text}".encode("ascii", "replace")[:MAX_LINE - 1]
    return line + b"\n"


def parse_server_line(raw: bytes) -> Tuple[str, list]:
    """Client side: (verb, fields) of one server line; an ERROR raises ProtocolError."""
    text = raw.rstrip(b"\r\n").decode("ascii", "replace")
    verb, _, rest = text.partition(" ")
    if verb == "ERROR":
        code, _, reason = rest.partition(" ")
        raise ProtocolError(code or MALFORMED, reason or "(no reason given)")
    return verb, rest.split(" ") if rest else []
