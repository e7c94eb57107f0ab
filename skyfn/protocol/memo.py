"""Memoization keys (DESIGN.md sections 3 and 6): what makes two task runs "the same".

A memoized task is identified by the hash of the function's code (its serialized body, as
registered), the container it runs in and its serialized arguments (the payload buffer, as
submitted). The service computes the key, looks it up per owner before dispatching, and
stores the result under it when a memoized task succeeds. Consequences a user can rely on:

- changing the function's code (re-registering it) changes the key: a miss;
- the same code registered twice (two function ids) shares the cache;
- arguments are compared by their serialized bytes: refs and large arguments uploaded to S3
  are compared by reference (the same ref hits, the same bytes uploaded twice do not);
- results are cached as they were stored: a large result stays in S3 (or in a data store,
  when the function returned a ref) and the cache holds the reference, not a copy.
"""
from __future__ import annotations

import hashlib

VERSION = b"skyfn-memo-1"


def function_digest(function_body: str, container: str | None = None) -> bytes:
    """Digest of what runs: the function's code and its container (computed once per function)."""
    h = hashlib.sha256(VERSION)
    for part in (function_body, container or ""):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))  # length-prefixed: no two splits hash alike
        h.update(data)
    return h.digest()


def memo_key(digest: bytes, payload: str) -> str:
    """Hex sha256 identifying (code, container, arguments); `digest` from function_digest."""
    return hashlib.sha256(digest + payload.encode("utf-8")).hexdigest()
