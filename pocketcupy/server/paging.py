"""OpenAI's cursor-paged list object ({object: "list", data, first_id, last_id, has_more}) by a query's
limit, order and after (the id of the entry the page starts after), for every listing route."""
from __future__ import annotations

from .protocol import bad, short_repr


def list_page(entries: list[dict], query, what: str, default_limit: int = 20, max_limit: int = 100,
              order: str | None = None) -> dict:
    """`entries` are in the order they were made; the query's order 'desc' (the default; `order` fixes it where
    the route has no such parameter) lists the newest first."""
    limit = query_int(query.get("limit", str(default_limit)), "limit")
    if not 1 <= limit <= max_limit:
        raise bad("limit", f"'limit' must be between 1 and {max_limit}, got {limit}")
    order = order or query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad("order", f"'order' must be 'asc' or 'desc', got {short_repr(order)}")
    ordered = entries if order == "asc" else entries[::-1]
    after = query.get("after")
    if after is not None:
        ids = [it["id"] for it in ordered]
        if after not in ids:
            raise bad("after", f"'after': no {what} with id {short_repr(after)}")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


def query_int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad(name, f"'{name}' must be an integer, got {short_repr(text)}") from None
