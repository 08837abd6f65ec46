"""The Responses API's `truncation`: with "auto", a conversation (the input items after the stored
ones of previous_response_id) whose rendered prompt does not fit the context with room for the output
loses whole turns from its beginning -- never the `instructions` or system / developer messages,
never the last user message -- as few as make it fit; with "disabled" (the default) it is the context
400. The stored conversation keeps every item: only the prompt is cut."""
from __future__ import annotations

from .chat import encode_prompt, parse_chat
from .protocol import ApiError, check_context
from .responses_input import renamed

KEPT_ROLES = ("system", "developer")


def fitted(state, chat_body: dict, origin: list[str], auto: bool):
    """(the parsed chat request, the request field each of its messages came from): the whole
    conversation's, or with auto the one with the fewest messages dropped that fits (if none does,
    the most dropped, whose prompt start_chat_job refuses with the context 400)."""
    msgs = chat_body["messages"]
    droppable = _droppable(msgs, origin)
    cuts = _cuts(msgs, droppable) if auto else [0]
    chosen = {}

    def parsed(k: int):
        if k not in chosen:
            drop = set(droppable[:k])
            keep = [i for i in range(len(msgs)) if i not in drop]
            kept_origin = [origin[i] for i in keep]
            with renamed(kept_origin):
                chosen[k] = parse_chat(state, dict(chat_body, messages=[msgs[i] for i in keep])), kept_origin
        return chosen[k]

    lo, hi = 0, len(cuts) - 1          # the fewest cuts[i] that fits: fitting grows with the cut
    while lo < hi:
        mid = (lo + hi) // 2 if lo else 0     # (the whole conversation first: it most often fits)
        if _fits(state, parsed(cuts[mid])[0]):
            hi = mid
        else:
            lo = mid + 1
    return parsed(cuts[lo])


def _droppable(msgs: list[dict], origin: list[str]) -> list[int]:
    """The messages auto truncation may drop, the oldest first: those before the last user message,
    but the instructions and system / developer ones."""
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=len(msgs))
    return [i for i in range(last_user) if msgs[i]["role"] not in KEPT_ROLES and origin[i] != "instructions"]


def _cuts(msgs: list[dict], drop: list[int]) -> list[int]:
    """How many of the droppable messages (drop) may go: none, or whole turns, so that the conversation
    left starts with a user message (no assistant reply or tool result without what it answered:
    templates that check the roles alternate refuse those)."""
    return [k for k in range(len(drop) + 1) if k in (0, len(drop)) or msgs[drop[k]]["role"] == "user"]


def _fits(state, req) -> bool:
    n = len(encode_prompt(state, req.text, req.add_special_tokens))
    try:
        check_context(state.engine.max_model_len, n, req.max_tokens, "input", "input")
    except ApiError:
        return False
    return True
