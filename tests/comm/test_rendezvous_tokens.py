"""Group tokens and line parsing of the rendezvous protocol (no server needed)."""
from __future__ import annotations

import pytest

from rendezvous import TokenError, make_token, verify_token
from rendezvous import protocol as P


def test_token_round_trip_and_format():
    token = make_token("s3cret", "grp-1", ttl_s=100, now=1_000_000)
    expiry, sig = token.split(".")
    assert expiry == "1000100" and len(sig) == 64
    verify_token("s3cret", "grp-1", token, now=1_000_050)
    verify_token(b"s3cret", "grp-1", token, now=1_000_100)   # bytes secret, last valid second


@pytest.mark.parametrize("secret,group,code", [("other", "grp-1", "bad_token"),
                                               ("s3cret", "grp-2", "bad_token")])
def test_token_for_another_secret_or_group_is_bad(secret, group, code):
    token = make_token("s3cret", "grp-1", now=1_000_000)
    with pytest.raises(TokenError) as err:
        verify_token(secret, group, token, now=1_000_001)
    assert err.value.code == code


def test_expired_token():
    token = make_token("s3cret", "g", ttl_s=10, now=1_000_000)
    with pytest.raises(TokenError) as err:
        verify_token("s3cret", "g", token, now=1_000_011)
    assert err.value.code == "expired_token"
    assert "mint a new one" in err.value.reason


@pytest.mark.parametrize("token", ["", "abc", "123", "123.xyz", "12." + "0" * 63, "x.%s" % ("0" * 64),
                                   "1.%s" % ("A" * 64)])
def test_malformed_token_is_bad(token):
    with pytest.raises(TokenError) as err:
        verify_token("s3cret", "g", token)
    assert err.value.code == "bad_token"


def test_token_arguments_are_checked():
    with pytest.raises(ValueError, match="invalid group id"):
        make_token("s", "has space")
    with pytest.raises(ValueError, match="invalid group id"):
        make_token("s", "x" * 129)
    with pytest.raises(ValueError, match="secret is empty"):
        make_token("", "g")


def test_parse_peer_lines():
    assert P.parse_peer_line(b"JOIN g.1:a@b_c-d tok 4 -1") == P.Join("g.1:a@b_c-d", "tok", 4, -1)
    assert P.parse_peer_line(b"JOIN g tok 4 3\r") == P.Join("g", "tok", 4, 3)
    assert P.parse_peer_line(b"RELAY g tok 0 5") == P.Relay("g", "tok", 0, 5)
    assert P.parse_peer_line(b"BARRIER 7") == P.Barrier(7)
    assert P.parse_peer_line(b"RESULT 2 relay") == P.Result(2, "relay")
    assert P.parse_peer_line(b"BYE") == P.Bye()


@pytest.mark.parametrize("line,fragment", [
    (b"HELLO", "unknown command"),
    (b"", "unknown command"),
    (b"JOIN g tok 4", "expected 'JOIN"),
    (b"JOIN g  tok 4 -1", "expected 'JOIN"),
    (b"JOIN g tok 0 -1", "size must be in"),
    (b"JOIN g tok four -1", "size must be an integer"),
    (b"JOIN g tok 4 -2", "rank must be in"),
    (b"JOIN g/x tok 4 -1", "group id"),
    (b"JOIN g tok 99999999999999999999999 0", "size must be"),
    (b"RELAY g tok 1 1", "both ends"),
    (b"RELAY g tok -1 1", "my_rank must be in"),
    (b"RESULT 1 carrier-pigeon", "expected 'RESULT"),
    (b"BARRIER -1", "epoch must be in"),
    (b"BYE now", "expected 'BYE'"),
    ("JOIN gr\u00fcn tok 2 -1".encode(), "not ASCII"),
    (b"\x00\xff\xfe", "not ASCII"),
])
def test_malformed_peer_lines(line, fragment):
    with pytest.raises(P.ProtocolError) as err:
        P.parse_peer_line(line)
    assert err.value.code == "malformed"
    assert fragment in err.value.reason


def test_error_line_is_one_bounded_line():
    line = P.error("malformed", "two\nlines " + "x" * 5000)
    assert line.count(b"\n") == 1 and line.endswith(b"\n") and len(line) <= P.MAX_LINE
    assert line.startswith(b"ERROR malformed two lines x")
    with pytest.raises(P.ProtocolError) as err:
        P.parse_server_line(b"ERROR rank_taken rank 1 is taken")
    assert (err.value.code, err.value.reason) == ("rank_taken", "rank 1 is taken")
