"""Globus: `GlobusFile(collection_id, path)` arguments staged in before a task runs and
outputs staged out after it; and a connector that keeps a store's objects on a collection.

    from skyfn.data import GlobusFile
    def analyse(data, out):
        x = np.load(data)                     # data is the staged local copy: open(data), np.load(data)
        np.save(out, x.mean(axis=0))          # out: write here; sent to its collection after the task
    ex.submit(analyse, GlobusFile(SRC, "/runs/7/x.npy"),
              GlobusFile(DST, "/results/7/mean.npy", output=True))

A GlobusFile pickles small (collection, path, output). When the SDK packs a task's
arguments it notes every GlobusFile met (skyfn.protocol.serialize.note_staging): the task
is submitted with `stage_in` / `stage_out` lists, so the endpoint's agent knows what to
move without deserializing anything (endpoint_agent/staging.py batches the transfers).
On the endpoint `os.fspath(gf)` / `str(gf)` is the local path (from SKYFN_GLOBUS_LOCAL,
set by the agent): the file itself when `collection` is the endpoint's own collection,
else `<root>/<stage_dir>/in|out/<collection>/<path>`. Outside a task `os.fspath` raises
an error saying so; `str(gf)` is then `globus://<collection><path>`.

GlobusConnector (Connector protocol) keeps objects as files under `directory` on a
collection: put writes a local file under the endpoint's collection and transfers it
there; get transfers it back and reads it; exists lists the directory; evict submits a
Delete task. TTLs travel in a 16-byte header of each object. It suits large objects that
must outlive the endpoint or cross sites without a shared Redis; staging is the main use.
"""
from __future__ import annotations

import json
import os
import posixpath
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

from skyfn.data.errors import DataConfigError, DataError

LOCAL_ENV = "SKYFN_GLOBUS_LOCAL"     # JSON {collection, root, stage_dir}: set by the agent for its workers


class GlobusFileError(DataError, ValueError):
    """A GlobusFile that cannot be used here (bad path, no local copy, transfer failed)."""


def _clean_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise GlobusFileError(f"GlobusFile path {path!r}: give an absolute path on the collection, such as "
                              "'/data/run1/x.npy'")
    parts = path.split("/")
    if ".." in parts:
        raise GlobusFileError(f"GlobusFile path {path!r}: '..' is not allowed; give the path from the "
                              "collection's root")
    clean = "/" + posixpath.normpath(path).lstrip("/")
    return clean + "/" if path.endswith("/") and clean != "/" else clean


class GlobusFile:
    """A file on a Globus collection, passed to a task by its location (see the module doc)."""

    __slots__ = ("collection", "path", "output")

    def __init__(self, collection: str, path: str, output: bool = False):
        from skyfn.data.globus_config import is_uuid

        if not isinstance(collection, str) or not is_uuid(collection):
            raise GlobusFileError(f"GlobusFile collection {collection!r}: give the collection's id (a UUID, as "
                                  "shown by the Globus web app or `globus endpoint search`)")
        object.__setattr__(self, "collection", collection.lower())
        object.__setattr__(self, "path", _clean_path(path))
        object.__setattr__(self, "output", bool(output))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("GlobusFile is immutable")

    def __reduce__(self):
        from skyfn.protocol.serialize import note_staging

        note_staging("stage_out" if self.output else "stage_in", {"collection": self.collection, "path": self.path})
        return GlobusFile, (self.collection, self.path, self.output)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, GlobusFile) and (self.collection, self.path, self.output) == \
            (other.collection, other.path, other.output)

    def __hash__(self) -> int:
        return hash((self.collection, self.path, self.output))

    def __repr__(self) -> str:
        return f"GlobusFile({self.collection!r}, {self.path!r}{', output=True' if self.output else ''})"

    @property
    def url(self) -> str:
        return f"globus://{self.collection}{self.path}"

    @property
    def local_path(self) -> Optional[Path]:
        """Where this file is on the endpoint running the task (None outside one)."""
        layout = Layout.from_env()
        return None if layout is None else layout.local(self.collection, self.path, self.output)

    def __fspath__(self) -> str:
        local = self.local_path
        if local is None:
            raise GlobusFileError(f"{self!r} has no local copy here: it is staged only inside a task, on an "
                                  "endpoint whose config.yaml has `data: globus:` (collection, root)")
        return str(local)

    def __str__(self) -> str:
        local = self.local_path
        return self.url if local is None else str(local)


@dataclass(frozen=True)
class Layout:
    """Where staged files live on an endpoint: its collection, that collection's local root."""

    collection: str
    root: Path
    stage_dir: str = ".skyfn-staging"

    def endpoint_path(self, collection: str, path: str, output: bool = False) -> str:
        """The path on the endpoint's collection of a file of `collection` (itself if local)."""
        if collection.lower() == self.collection.lower():
            return path
        return f"/{self.stage_dir.strip('/')}/{'out' if output else 'in'}/{collection.lower()}{path}"

    def local(self, collection: str, path: str, output: bool = False) -> Path:
        return self.root / self.endpoint_path(collection, path, output).lstrip("/")

    def env(self) -> dict[str, str]:
        return {LOCAL_ENV: json.dumps({"collection": self.collection, "root": str(self.root),
                                       "stage_dir": self.stage_dir})}

    @classmethod
    def from_env(cls) -> Optional["Layout"]:
        raw = os.environ.get(LOCAL_ENV)
        if not raw:
            return None
        doc = json.loads(raw)
        return cls(doc["collection"], Path(doc["root"]), doc.get("stage_dir") or ".skyfn-staging")


# --- transfers, waited on (the connector's path; the agent batches with staging.py) ----
def wait_task(tc, task_id: str, timeout: float, poll_min: float = 0.05, poll_max: float = 5.0) -> dict:
    """Poll a Transfer task with backoff until it is no longer ACTIVE; its document."""
    delay, end = poll_min, time.monotonic() + timeout
    while True:
        task = tc.get_task(task_id)
        if task["status"] != "ACTIVE":
            return task.data
        if time.monotonic() >= end:
            tc.cancel_task(task_id)
            raise GlobusFileError(f"Globus task {task_id} did not finish within {timeout:.0f} s; cancelled it")
        time.sleep(delay)
        delay = min(poll_max, delay * 1.5)


def describe_failure(task: dict) -> str:
    """Globus's reason for a failed task: its fatal error code and description (and nice_status)."""
    fatal = task.get("fatal_error") or {}
    code = fatal.get("code") or task.get("nice_status") or "FAILED"
    text = fatal.get("description") or task.get("nice_status_short_description") or "the transfer failed"
    return f"{code}: {text}"


_HEADER = struct.Struct("!8sd")     # magic, expiry (0: none)
_MAGIC = b"SKYFNGL1"


class GlobusConnector:
    """Objects as files under `directory` on `collection`, moved by Transfer (see module doc)."""

    kind: ClassVar[str] = "globus"

    def __init__(self, collection: str, directory: str, local: dict, timeout: float = 3600.0):
        from skyfn.data.globus_config import parse_globus

        if not isinstance(collection, str) or not collection:
            raise DataConfigError("a globus connector needs 'collection' (the UUID where objects are kept)")
        self.collection = collection.lower()
        self.directory = _clean_path(directory.rstrip("/") or "/")
        self.local_config = dict(local)
        try:
            self.settings = parse_globus(self.local_config, "globus connector local")
        except ValueError as exc:
            raise DataConfigError(str(exc)) from None
        self.layout = Layout(self.settings.collection, self.settings.root_path, self.settings.stage_dir)
        self.timeout = float(timeout)
        self._tc = None

    @property
    def client(self):
        if self._tc is None:
            from skyfn.data.globus_config import transfer_client

            self._tc = transfer_client(self.settings, self.settings.token_path())
        return self._tc

    def _remote(self, key: str) -> str:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"key {key!r} is not a plain name")
        return f"{self.directory.rstrip('/')}/{key}"

    def _scratch(self) -> tuple[str, Path]:
        rel = f"/{self.settings.stage_dir.strip('/')}/objects/{uuid.uuid4().hex}"
        local = self.layout.root / rel.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        return rel, local

    def _transfer(self, src: str, src_path: str, dst: str, dst_path: str) -> dict:
        import globus_sdk

        data = globus_sdk.TransferData(src, dst, label="skyfn store", sync_level=self.settings.sync_level
                                       or globus_sdk.MISSING)
        data.add_item(src_path, dst_path)
        task_id = self.client.submit_transfer(data)["task_id"]
        return wait_task(self.client, task_id, self.timeout, self.settings.poll_min / 10, self.settings.poll_max)

    def put(self, key: str, frames: Sequence, ttl: Optional[float] = None) -> None:
        rel, local = self._scratch()
        try:
            with open(local, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, 0.0 if ttl is None else time.time() + ttl))
                for frame in frames:
                    f.write(frame)
            task = self._transfer(self.settings.collection, rel, self.collection, self._remote(key))
        finally:
            local.unlink(missing_ok=True)
        if task["status"] != "SUCCEEDED":
            raise GlobusFileError(f"could not put {key!r} on collection {self.collection}: {describe_failure(task)}")

    def get(self, key: str):
        rel, local = self._scratch()
        try:
            task = self._transfer(self.collection, self._remote(key), self.settings.collection, rel)
            if task["status"] != "SUCCEEDED":
                if (task.get("fatal_error") or {}).get("code") == "FILE_NOT_FOUND":
                    return None
                raise GlobusFileError(f"could not get {key!r} from collection {self.collection}: "
                                      f"{describe_failure(task)}")
            data = local.read_bytes()
        finally:
            local.unlink(missing_ok=True)
        magic, expires = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise GlobusFileError(f"{self._remote(key)} on {self.collection} is not a skyfn object")
        if expires and time.time() > expires:
            self.evict(key)
            return None
        return memoryview(data)[_HEADER.size:]

    def exists(self, key: str) -> bool:
        import globus_sdk

        try:
            listing = self.client.operation_ls(self.collection, path=self.directory)
        except globus_sdk.TransferAPIError as exc:
            if exc.http_status == 404:
                return False
            raise
        return any(e["name"] == key and e["type"] == "file" for e in listing["DATA"])

    def evict(self, key: str) -> None:
        import globus_sdk

        if not self.exists(key):
            return
        data = globus_sdk.DeleteData(self.collection, label="skyfn evict")
        data.add_item(self._remote(key))
        wait_task(self.client, self.client.submit_delete(data)["task_id"], self.timeout,
                  self.settings.poll_min / 10, self.settings.poll_max)

    def config(self) -> dict:
        return {"kind": self.kind, "collection": self.collection, "directory": self.directory,
                "local": self.local_config, "timeout": self.timeout}

    @classmethod
    def from_config(cls, config: dict) -> "GlobusConnector":
        try:
            return cls(config["collection"], config.get("directory", "/skyfn-store"), config["local"],
                       config.get("timeout", 3600.0))
        except KeyError as exc:
            raise DataConfigError(f"a globus connector config needs {exc.args[0]!r} (collection, directory, local: "
                                  "{collection, root, token_file, ...})") from None

    def close(self) -> None:
        tc, self._tc = self._tc, None
        if tc is not None and hasattr(tc, "close"):
            tc.close()


__all__ = ["GlobusConnector", "GlobusFile", "GlobusFileError", "Layout", "LOCAL_ENV", "describe_failure",
           "wait_task"]
