"""Responses API items as a stored response lists them (GET /v1/responses/<id>/input_items): each
input item with an id and a status, a message's string content as one text part (OpenAI's
ResponseItem shapes); and the list's pages (paging.py)."""
from __future__ import annotations

import uuid

from .paging import list_page

ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fc", "reasoning": "rs"}


def item_id(prefix: str) -> str:
    """OpenAI's ids: resp_..., msg_..., rs_..., fc_..."""
    return f"{prefix}_{uuid.uuid4().hex}"


def listed(item: dict) -> dict:
    """An input item (already checked by responses_input) as the list gives it back."""
    kind = item.get("type", "message")
    out = dict(item, type=kind, id=item.get("id") or item_id(ID_PREFIXES[kind]),
               status=item.get("status") or "completed")
    if kind == "message" and isinstance(item["content"], str):
        part = {"type": "output_text", "text": item["content"], "annotations": []} if item["role"] == "assistant" \
            else {"type": "input_text", "text": item["content"]}
        out["content"] = [part]
    if kind == "reasoning":     # (the list's ResponseReasoningItem requires one; the API's request does not)
        out.setdefault("summary", [])
    return out


def item_page(items: list[dict], query) -> dict:
    """The list object of `items` (in the order they were sent) by the query's limit (1-100, 20),
    order ('desc', the newest first, or 'asc') and after (the id of the item the page starts after)."""
    return list_page(items, query, "input item in this response")
