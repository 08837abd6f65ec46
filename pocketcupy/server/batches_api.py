"""The Batches API's routes' work (/v1/batches): create (checks the request and its input file), retrieve,
list and cancel; the batches run in batch_jobs.py."""
from __future__ import annotations

from .batch import URLS
from .files_api import no_file
from .paging import list_page
from .protocol import ApiError, Fields, bad, check_metadata, short_repr


def create(state, app, body: dict) -> dict:
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise bad("input_file_id", "'input_file_id' is required: the id of a file uploaded with purpose 'batch'")
    endpoint = body.get("endpoint")
    if endpoint not in URLS:
        raise bad("endpoint", f"'endpoint' must be one of {', '.join(URLS)}, got {short_repr(endpoint)}")
    window = body.get("completion_window")
    if window != "24h":
        raise bad("completion_window", f"'completion_window' must be '24h', got {short_repr(window)}")
    metadata = Fields(body).obj("metadata")
    check_metadata(metadata)
    obj = state.files.get(file_id)
    if obj is None:
        raise no_file(file_id, "input_file_id")
    if obj["purpose"] != "batch":
        raise bad("input_file_id", f"the file {file_id} has purpose '{obj['purpose']}'; a batch's input file "
                                   "must be uploaded with purpose 'batch'")
    return state.batches.create(app, file_id, endpoint, metadata)


def listing(state, query) -> dict:
    return list_page(state.batches.listed(), query, "batch", order="desc")


def cancel(state, batch_id: str) -> dict:
    job = state.batches.get(batch_id)
    if not job.cancel():
        raise ApiError(400, f"Cannot cancel a batch with status '{job.view()['status']}'", "batch_id")
    return job.view()
