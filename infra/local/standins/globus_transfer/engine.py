"""The copy engine of the Globus Transfer stand-in (infra/local/standins/globus_transfer): each task
runs in its own thread, item by item -- a copy to a temporary name renamed into place
(parent directories created, sync levels honoured), or a delete -- and ends SUCCEEDED or
FAILED with Globus's fatal error; the task log follows every task."""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from infra.local.standins.globus_transfer.model import Task, TransferLog, stamp

log = logging.getLogger("skyfn.local.globus")


class CopyEngine:
    """The copying side of TransferStandIn: what runs after a task is accepted."""

    lock: threading.Lock
    log: TransferLog
    copy_delay: float
    log_file: Optional[str]
    local_path: Callable[[str, str], Path]  # TransferStandIn's: (collection, path) -> where it is here

    def _run(self, task: Task) -> None:
        try:
            if self.copy_delay and task.cancel.wait(self.copy_delay):
                return self._cancelled(task)
            task.nice_status, task.started = "OK", True
            for item in task.items:
                if task.cancel.is_set():
                    return self._cancelled(task)
                if task.kind == "DELETE":
                    self._delete(task, item)
                    task.processed += 1
                    continue
                error = self._copy(task, item)
                task.processed += 1
                if error is None:
                    continue
                code, description = error
                if code == "FILE_NOT_FOUND" and task.options.get("skip_source_errors"):
                    task.skipped.append({"DATA_TYPE": "skipped_error", "error_code": code,
                                         "error_details": description, "error_time": stamp(time.time()),
                                         "source_path": item["source_path"],
                                         "destination_path": item["destination_path"],
                                         "is_directory": False, "is_symlink": False, "checksum_algorithm": None,
                                         "external_checksum": None, "is_delete_destination_extra": False})
                    continue
                details = (f"Error ({'transfer' if code != 'PERMISSION_DENIED' else 'write'})\n"
                           f"Endpoint: stand-in collection {task.source}\n"
                           f"Server: 127.0.0.1\nFile: {item['source_path']}\n"
                           f"Message: 550-GlobusError: {description}")
                return self._finish(task, "FAILED", code, details, {"code": code, "description": description})
            self._finish(task, "SUCCEEDED", None, None, None)
        except Exception as exc:  # noqa: BLE001 - a stand-in bug must still end the task
            log.exception("stand-in task %s failed", task.task_id)
            self._finish(task, "FAILED", "ENDPOINT_ERROR", str(exc), {"code": "ENDPOINT_ERROR",
                                                                        "description": str(exc)})

    def _copy(self, task: Task, item: dict) -> Optional[tuple[str, str]]:
        src = self.local_path(task.source, item["source_path"])
        dst = self.local_path(task.destination, item["destination_path"])
        if not src.exists():
            return "FILE_NOT_FOUND", "No such file or directory"
        try:
            if src.is_dir():
                if not item.get("recursive"):
                    return "NOT_A_FILE", f"{item['source_path']} is a directory: set recursive"
                files = [p for p in src.rglob("*") if p.is_file()]
                copied = [self._copy_file(task, p, dst / p.relative_to(src)) for p in files]
                moved = any(copied) or not files
            else:
                moved = self._copy_file(task, src, dst)
        except FileNotFoundError:
            return "FILE_NOT_FOUND", "No such file or directory"
        except PermissionError:
            return "PERMISSION_DENIED", "Permission denied"
        except (IsADirectoryError, NotADirectoryError) as exc:
            return "ENDPOINT_ERROR", exc.strerror or str(exc)
        if moved:  # like Globus: files left alone by the sync level are not listed
            task.succeeded.append({"DATA_TYPE": "successful_transfer", "source_path": item["source_path"],
                                   "destination_path": item["destination_path"]})
        return None

    @staticmethod
    def _in_sync(level: Any, src: Path, dst: Path) -> bool:
        """Globus's sync levels: 0/exists, 1/size, 2/mtime (destination not older), 3/checksum."""
        if level is None or not dst.is_file():
            return False
        level = {"exists": 0, "size": 1, "mtime": 2, "checksum": 3}.get(level, level)
        a, b = src.stat(), dst.stat()
        if level == 0:
            return True
        if level == 1:
            return a.st_size == b.st_size
        if level == 2:
            return a.st_size == b.st_size and b.st_mtime >= a.st_mtime
        import hashlib

        digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (src, dst)]
        return digest[0] == digest[1]

    def _copy_file(self, task: Task, src: Path, dst: Path) -> bool:
        if self._in_sync(task.options.get("sync_level"), src, dst):
            task.files_skipped += 1
            return False
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.globus-{task.task_id[:8]}.part")
        try:
            shutil.copyfile(src, tmp)
            if task.options.get("preserve_timestamp") or task.options.get("sync_level") in ("mtime", 2):
                st = src.stat()
                os.utime(tmp, (st.st_atime, st.st_mtime))
            os.replace(tmp, dst)
        finally:
            if tmp.exists():
                tmp.unlink()
        task.bytes_transferred += dst.stat().st_size
        task.files_transferred += 1
        return True

    def _delete(self, task: Task, item: dict) -> None:
        target = self.local_path(task.source, item["path"])
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        task.succeeded.append({"DATA_TYPE": "successful_delete", "path": item["path"]})

    def _cancelled(self, task: Task) -> None:
        self._finish(task, "FAILED", "CANCELED", "The task was canceled by its owner",
                     {"code": "CANCELED", "description": "The task was canceled by its owner"})

    def _finish(self, task: Task, status: str, nice: Optional[str], details: Optional[str],
                fatal: Optional[dict]) -> None:
        with self.lock:
            task.status, task.nice_status, task.nice_details, task.fatal_error = status, nice, details, fatal
            task.completion_time = time.time()
        with self.log.lock:
            self.log.active -= 1
            for rec in self.log.tasks:
                if rec["task_id"] == task.task_id:
                    rec.update(status=status, completed=task.completion_time,
                               fatal_error=fatal, succeeded=len(task.succeeded), skipped=len(task.skipped))
        self._write_log()

    def _write_log(self) -> None:
        if self.log_file:
            tmp = self.log_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.log.snapshot(), f, indent=1)
            os.replace(tmp, self.log_file)
