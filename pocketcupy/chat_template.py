"""Chat templates: Jinja2 rendering set up like Hugging Face transformers' chat template renderer."""
from __future__ import annotations

import functools
import json
import os
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _GenerationTag(Extension):
    """Accepts transformers' {% generation %}...{% endgeneration %} (assistant-mask markers) and
    renders the body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def check_template(template: str, field: str = "chat template") -> None:
    """A template Jinja cannot parse: ValueError 'chat template: line N: ...' (field: the name it starts with)."""
    try:
        _compile(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{field}: line {e.lineno}: {e.message}") from None
    except RecursionError:      # Jinja's parser recurses once an expression level
        raise ValueError(f"{field}: nested too deeply for Jinja's parser") from None


def template_text(value, field: str = "chat_template") -> str:
    """A chat template given as its text (vLLM's LLM.chat chat_template), checked for Jinja syntax; a
    value that looks like a file's path is refused (load_chat_template reads a file)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field}: must be a non-empty string (a Jinja template), got {value!r:.60}")
    if looks_like_path(value):
        raise ValueError(f"{field}: {value!r:.60} looks like a file's path; pass the template's text "
                         "(chat_template.load_chat_template reads a file)")
    check_template(value, field)
    return value


TEMPLATE_FILE_SUFFIXES = (".jinja", ".jinja2", ".j2")


def looks_like_path(value: str) -> bool:
    """vLLM's rule: a path separator or a template file's suffix makes a value a path. Not where it
    holds a Jinja delimiter ({{, {%, {#) or a newline: inline templates are full of '/' ('</s>', '[/INST]')."""
    if "\n" in value or any(d in value for d in ("{{", "{%", "{#")):
        return False
    seps = ("/", os.sep) + ((os.altsep,) if os.altsep else ())
    return any(s in value for s in seps) or value.lower().endswith(TEMPLATE_FILE_SUFFIXES)


def load_chat_template(value: str, field: str = "chat_template") -> str:
    """A chat template given as a file or as the text itself (vLLM's --chat-template): an existing
    file is read; a value that looks like a path (looks_like_path) but is no file is an error (it was
    taken as template text when it held a '{'); other text with a '{' is the template, its backslash
    escapes decoded as vLLM does (a shell's "\\n" is a newline). Checked for Jinja syntax. Errors:
    ValueError naming `field`."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field}: must be a non-empty string (a template or a file), got {value!r:.60}")
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"{field}: {value} is not UTF-8 text ({e})") from None
        except OSError as e:
            raise ValueError(f"{field}: {value} cannot be read ({e.strerror or e})") from None
    elif looks_like_path(value):
        what = "is not a file" if os.path.exists(value) else "does not exist"
        raise ValueError(f"{field}: {value} looks like a template file's path, but it {what}")
    elif "{" in value:   # (non-Latin-1 characters pass as \u escapes: non-ASCII text survives)
        try:
            text = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError as e:
            raise ValueError(f"{field}: a bad backslash escape in the template ({e.reason})") from None
    else:
        raise ValueError(f"{field}: {value} is neither a file nor a template")
    check_template(text, field)
    return text


# what render_chat sets itself; chat_template_kwargs (extra template variables) may not
RESERVED_VARIABLES = ("messages", "tools", "add_generation_prompt", "continue_final_message", "bos_token", "eos_token",
                      "chat_template")


def check_template_kwargs(kwargs) -> dict:
    """chat_template_kwargs (e.g. {"enable_thinking": False}) checked: a dict of variable names that
    are not render_chat's own."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"chat_template_kwargs: must be a dict of template variables, got {kwargs!r:.60}")
    taken = [k for k in RESERVED_VARIABLES if k in kwargs]
    if taken:
        raise ValueError(f"chat_template_kwargs: {taken[0]!r} is not a template variable to set here "
                         f"(it has its own argument)")
    return kwargs


def _content_text(content, where: str, role: str) -> str | None:
    """A message's content as text: a list of parts is their texts joined by newlines. An assistant's
    refusal parts (OpenAI's, in a conversation replayed to the model) count as its text, as vLLM reads them."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            key = "refusal" if kind == "refusal" and role == "assistant" else "text"
            if kind != key or not isinstance(part.get(key), str):
                want = "{'type': 'text', 'text': str}" + (
                    " or {'type': 'refusal', 'refusal': str}" if role == "assistant" else "")
                raise ValueError(f"{where}.content[{j}]: must be {want}; this model reads text only "
                                 f"(got type {kind!r:.40})")
            texts.append(part[key])
        return "\n".join(texts)
    raise ValueError(f"{where}.content: must be a string, null or a list of text parts, "
                     f"got {type(content).__name__}")


REASONING_FIELDS = ("reasoning", "reasoning_content")


def _reasoning_fields(m: dict, where: str) -> None:
    """An assistant turn's earlier reasoning under either name (vLLM's `reasoning`, the older
    `reasoning_content` that Qwen3's and DeepSeek's templates read): both names, as vLLM hands it on."""
    for key in REASONING_FIELDS:
        if m.get(key) is not None and not isinstance(m[key], str):
            raise ValueError(f"{where}.{key}: must be a string or null, got {type(m[key]).__name__}")
    text = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
    if text is not None:
        m.update(dict.fromkeys(REASONING_FIELDS, text))


def validate_messages(messages) -> list[dict]:
    """Checked copies of the messages with list-of-parts content flattened to text."""
    if not isinstance(messages, list):
        raise ValueError(f"messages: must be a list, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{where}: must be an object, got {type(m).__name__}")
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise ValueError(f"{where}.role: must be a non-empty string")
        m = dict(m)
        m["content"] = _content_text(m.get("content"), where, m["role"])
        if m["content"] is None and m["role"] != "assistant":
            raise ValueError(f"{where}.content: required (it may be null only in assistant messages)")
        if "tool_calls" in m and m["tool_calls"] is not None and not isinstance(m["tool_calls"], list):
            raise ValueError(f"{where}.tool_calls: must be a list")
        if m["role"] == "assistant":
            _reasoning_fields(m, where)
        out.append(m)
    return out


def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                tools: list | None = None, bos_token: str = "", eos_token: str = "",
                continue_final_message: bool = False, **extra) -> str:
    """The conversation as the template writes it; continue_final_message: cut after the last
    message's content, so the model continues that message (transformers' and vLLM's option;
    not with add_generation_prompt)."""
    # an assistant turn with neither content nor tool calls is an empty one, also for templates that
    # concatenate the content (SmolLM2's raised TypeError on None)
    msgs = [dict(m, content="") if m["content"] is None and not m.get("tool_calls") else m
            for m in validate_messages(messages)]
    if tools is not None and not isinstance(tools, list):
        raise ValueError(f"tools: must be a list, got {type(tools).__name__}")
    for name, flag in (("add_generation_prompt", add_generation_prompt),
                       ("continue_final_message", continue_final_message)):
        if not isinstance(flag, bool):   # "false" was true
            raise ValueError(f"{name}: must be a bool, got {flag!r}")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message: cannot be combined with add_generation_prompt")
    if continue_final_message and not msgs:
        raise ValueError("continue_final_message: there is no message to continue (messages is empty)")
    text = _render(template, msgs, tools, add_generation_prompt, bos_token, eos_token, extra)
    if not continue_final_message:
        return text
    final = msgs[-1].get("content") or ""
    for content in (final, final.strip()):
        end = text.rfind(content) if content else -1
        if end >= 0:
            return text[:end + len(content)]
    raise ValueError("continue_final_message: the chat template does not write the last message's content "
                     "verbatim (or it is empty)")


def _render(template, msgs, tools, add_generation_prompt, bos_token, eos_token, extra) -> str:
    try:
        return _compile(template if template is not None else CHATML_TEMPLATE).render(
            messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token, **extra)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template: {e.message or e}") from e
    except (TypeError, KeyError, AttributeError, IndexError, ValueError, ArithmeticError, RecursionError) as e:
        # ArithmeticError: also the sandbox's OverflowError for a range over MAX_RANGE; RecursionError:
        # a recursive macro (e.g. one writing a tool's parameters) on deeply nested input
        raise ValueError(f"chat template: {type(e).__name__}: {e}") from e
