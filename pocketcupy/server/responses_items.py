"""Responses API items as a stored response lists them (GET /v1/responses/<id>/input_items): each
input item with an id and a status, a message's string content as one text part (OpenAI's
ResponseItem shapes); and the list's pages (limit, order, after)."""
from __future__ import annotations

import uuid

from .protocol import bad, short_repr

ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fc", "reasoning": "rs"}
MAX_LIMIT = 100


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
    limit = query_int(query.get("limit", "20"), "limit")
    if not 1 <= limit <= MAX_LIMIT:
        raise bad("limit", f"'limit' must be between 1 and {MAX_LIMIT}, got {limit}")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad("order", f"'order' must be 'asc' or 'desc', got {short_repr(order)}")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [it["id"] for it in ordered]
        if after not in ids:
            raise bad("after", f"'after': no input item with id {short_repr(after)} in this response")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


def query_int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad(name, f"'{name}' must be an integer, got {short_repr(text)}") from None
