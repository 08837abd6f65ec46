"""POST /tokenize and /detokenize (vLLM's): a prompt or a chat conversation -> token ids, token ids -> text."""
from __future__ import annotations

from .chat import parse_template_fields, render_messages
from .protocol import Fields, bad, optional_model, parse_token_ids
from .tool_prompt import parse_messages, parse_tools


def handle_tokenize(state, body: dict) -> dict:
    """{"prompt": str} or {"messages": [...], tools, chat-template options} -> {"count", "max_model_len",
    "tokens", "token_strs"}. add_special_tokens defaults to true for a prompt, false for messages (the
    template writes them)."""
    engine, tok = state.engine, state.engine.tokenizer
    f = Fields(body)
    optional_model(f, state.config.served_model_names)
    chat = f.get("messages") is not None
    if chat == (f.get("prompt") is not None):
        raise bad("prompt", "exactly one of 'prompt' and 'messages' is required")
    if chat:
        msgs, tools = parse_messages(f.require("messages")), parse_tools(f.get("tools"))
        template = parse_template_fields(f)
    else:
        text = f.str("prompt")
    add_special = f.bool("add_special_tokens", not chat)
    strs = f.bool("return_token_strs", False)
    f.reject_unknown()
    if chat:
        text = render_messages(engine, msgs, tools, template)
    try:
        ids = tok.encode(text, add_special_tokens=add_special)
    except ValueError as e:
        raise bad("messages" if chat else "prompt", str(e)) from None
    return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids,
            "token_strs": [tok.id_to_token(t) for t in ids] if strs else None}


def handle_detokenize(state, body: dict) -> dict:
    """{"tokens": [ids]} -> {"prompt": text} (special tokens kept, as vLLM does)."""
    tok = state.engine.tokenizer
    f = Fields(body)
    optional_model(f, state.config.served_model_names)
    f.require("tokens")
    f.reject_unknown()
    return {"prompt": tok.decode(parse_token_ids(f, "tokens", tok.vocab_size))}
