"""The Files API's store (/v1/files): each file's bytes on disk as <id>, its file object (OpenAI's FileObject)
beside them as <id>.json, in one folder: --files-dir (the files there are listed again after a restart), else
a temporary folder made at the first upload and removed when the server stops. A file is written as
<id>.part and only becomes one (listed, readable) when it is kept."""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid

log = logging.getLogger("pocketcupy.server")


class FileStore:
    def __init__(self, directory: str | None = None):
        self._dir, self._temporary = directory, directory is None
        self._files: dict[str, dict] = {}   # id -> file object, in the order they were made
        self._lock = threading.Lock()
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            self._load()

    def _load(self) -> None:
        for part in glob.glob(os.path.join(self._dir, "*.part")):   # a write the last run did not finish
            os.remove(part)
        found = []
        for meta in glob.glob(os.path.join(self._dir, "file-*.json")):
            try:
                with open(meta, encoding="utf-8") as f:
                    found.append(json.load(f))
            except (OSError, ValueError) as e:
                log.warning("files: skipping %s: %s", meta, e)
        for obj in sorted(found, key=lambda o: (o["created_at"], o["id"])):
            self._files[obj["id"]] = obj

    def _folder(self) -> str:
        with self._lock:
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="pocketcupy-files-")
            return self._dir

    def new(self, filename: str, purpose: str) -> "NewFile":
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        return NewFile(self, os.path.join(self._folder(), file_id), {
            "id": file_id, "object": "file", "bytes": 0, "created_at": int(time.time()), "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": None, "status_details": None})

    def _keep(self, path: str, obj: dict) -> None:
        with open(path + ".json.part", "w", encoding="utf-8") as f:
            json.dump(obj, f)
        os.replace(path + ".part", path)
        os.replace(path + ".json.part", path + ".json")
        with self._lock:
            self._files[obj["id"]] = obj

    def get(self, file_id: str) -> dict | None:
        with self._lock:
            return self._files.get(file_id)

    def path(self, file_id: str) -> str:
        return os.path.join(self._dir, file_id)

    def listed(self, purpose: str | None = None) -> list[dict]:
        """The file objects (of that purpose), the oldest first."""
        with self._lock:
            return [o for o in self._files.values() if purpose is None or o["purpose"] == purpose]

    def delete(self, file_id: str) -> bool:
        with self._lock:
            if self._files.pop(file_id, None) is None:
                return False
        for path in (self.path(file_id), self.path(file_id) + ".json"):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        return True

    def close(self) -> None:
        """Removes the temporary folder (a --files-dir stays)."""
        if self._temporary and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class NewFile:
    """A file being written into the store: write() its bytes, then keep() it (the file object) or drop() it."""

    def __init__(self, store: FileStore, path: str, obj: dict):
        self.store, self.path, self.obj = store, path, obj
        self.id = obj["id"]
        self._f = open(path + ".part", "wb")

    def write(self, data: bytes) -> None:
        self._f.write(data)
        self.obj["bytes"] += len(data)

    def keep(self) -> dict:
        self._f.close()
        self.store._keep(self.path, self.obj)
        return self.obj

    def drop(self) -> None:
        self._f.close()
        os.remove(self.path + ".part")
