"""The Files API's routes' work (/v1/files): upload (a multipart form of `file` and `purpose`, up to
--max-file-bytes), list, retrieve, content and delete, over the server's file store (files_store.py)."""
from __future__ import annotations

import os

from .paging import list_page
from .protocol import ApiError, bad, short_repr

# the purposes a client may upload for (the openai client's FilePurpose); the server itself makes batch_output
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
MAX_LIST = 10000   # OpenAI's list limit (and its default)


def upload(store, form, files) -> dict:
    purpose = form.get("purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise bad("purpose", f"'purpose' must be one of {', '.join(UPLOAD_PURPOSES)}, got {short_repr(purpose)}")
    sent = files.get("file")
    if sent is None:
        raise bad("file", "'file' is required: the file's bytes as a part of a multipart/form-data body")
    new = store.new(os.path.basename(sent.filename or "") or "file", purpose)
    try:
        while chunk := sent.stream.read(1 << 20):
            new.write(chunk)
    except BaseException:
        new.drop()
        raise
    return new.keep()


def found(store, file_id: str) -> dict:
    obj = store.get(file_id)
    if obj is None:
        raise no_file(file_id, "file_id")
    return obj


def no_file(file_id: str, param: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", param, "not_found")


def opened(store, file_id: str):
    """The file's bytes, open for reading."""
    found(store, file_id)
    try:
        return open(store.path(file_id), "rb")
    except FileNotFoundError:   # deleted meanwhile
        raise no_file(file_id, "file_id") from None


def listing(store, query) -> dict:
    return list_page(store.listed(query.get("purpose")), query, "file", MAX_LIST, MAX_LIST)


def deleted(store, file_id: str) -> dict:
    if not store.delete(file_id):
        raise no_file(file_id, "file_id")
    return {"id": file_id, "object": "file", "deleted": True}
