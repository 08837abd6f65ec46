"""The Responses API's response store (`--responses-store N`): the last N responses a server made
with `store` true, in memory and in this process only, so that `previous_response_id` continues a
conversation, an `item_reference` input item finds the item it names, and GET / DELETE
/v1/responses/<id> (and GET .../input_items) find a response. Least recently used ones go first.
Each keeps the input items its conversation had (the previous turns' included; not the
`instructions`, which, as OpenAI's API says, do not carry over) and its output."""
from __future__ import annotations

import threading
from collections import OrderedDict


class ResponseStore:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"responses_store: must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[list, dict, int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict, input_items: list, first: int = 0) -> None:
        """input_items: the conversation's, the request's own from index `first` (before it: a previous
        response's)."""
        with self._lock:
            self._items[response["id"]] = (input_items, response, first)
            self._items.move_to_end(response["id"])
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[list, dict, int] | None:
        """(the conversation's input items, the response, the index of the request's own first), or None."""
        with self._lock:
            found = self._items.get(response_id)
            if found is not None:
                self._items.move_to_end(response_id)
            return found

    def item(self, item_id: str) -> dict | None:
        """The input or output item of that id in a stored response (the most recent first), or None."""
        with self._lock:
            for input_items, response, _ in reversed(self._items.values()):
                for it in input_items + response["output"]:
                    if it.get("id") == item_id:
                        return it
        return None

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def history(self, response_id: str) -> list | None:
        """The input items that continue the conversation after this response (its input, then its
        output items), or None if it is not stored."""
        found = self.get(response_id)
        return None if found is None else found[0] + found[1]["output"]
