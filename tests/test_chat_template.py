import json
import os
import re
import shutil

import pytest

from pocketcupy.chat_template import CHATML_TEMPLATE, load_chat_template, render_chat
from pocketcupy.tokenizer import Tokenizer

SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def smol(smollm2_gguf):
    return Tokenizer.from_gguf(smollm2_gguf)


def test_smollm2_template(smol):
    out = smol.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out == SMOL_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}]
    out = smol.apply_chat_template(msgs, add_generation_prompt=False)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n4<|im_end|>\n")
    ids = smol.encode(out, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 3
    assert smol.decode(ids) == out


def test_continue_final_message(smol):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! I am "}]
    out = smol.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True)
    assert out == SMOL_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello! I am "
    parts = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "Sure"}]}]
    assert render_chat(None, parts, False, continue_final_message=True).endswith("<|im_start|>assistant\nSure")
    # a template that strips the content: cut after the stripped text
    strip = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}"
    assert render_chat(strip, msgs, False, continue_final_message=True) == "<user>hi</user><assistant>Hello! I am"
    with pytest.raises(ValueError, match="^continue_final_message: cannot be combined"):
        smol.apply_chat_template(msgs, continue_final_message=True)
    for bad_final in ({"role": "assistant", "content": None}, {"role": "assistant", "content": ""}):
        with pytest.raises(ValueError, match="^continue_final_message: the chat template does not write"):
            render_chat(None, msgs[:1] + [bad_final], False, continue_final_message=True)
    hidden = "{% for m in messages %}<{{ m.role }}>{% endfor %}"
    with pytest.raises(ValueError, match="^continue_final_message"):
        render_chat(hidden, msgs, False, continue_final_message=True)
    # no message to continue: was an IndexError
    with pytest.raises(ValueError, match="^continue_final_message: there is no message to continue"):
        render_chat(None, [], False, continue_final_message=True)


def test_chatml_fallback():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    assert render_chat(None, msgs, add_generation_prompt=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")
    assert render_chat(None, [], add_generation_prompt=True) == "<|im_start|>assistant\n"
    assert render_chat(CHATML_TEMPLATE, msgs) == render_chat(None, msgs)
    # a template that concatenates the content gets "" for an assistant turn without content or calls
    concat = "{% for m in messages %}{{ m.role + ':' + m.content + ';' }}{% endfor %}"
    assert render_chat(concat, msgs, add_generation_prompt=False) == "user:hi;assistant:;"


def test_content_parts_flattened():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_chat("{{ messages[0].content }}", msgs) == "a\nb"


def test_helpers_and_variables():
    tpl = ("{{ bos_token }}{% for m in messages %}{{ m.role }}{% endfor %}|{{ tools | tojson }}"
           "|{{ eos_token }}|{{ custom }}|{{ {'k': 'é'} | tojson }}|{{ strftime_now('%Y') | length }}"
           "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
           "{% generation %}G{% endgeneration %}")
    out = render_chat(tpl, [{"role": "user", "content": "x"}], tools=[{"type": "function"}],
                      bos_token="<s>", eos_token="</s>", custom=7)
    assert out == '<s>user|[{"type": "function"}]|</s>|7|{"k": "é"}|401G'


def test_trim_and_lstrip_blocks():
    tpl = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert render_chat(tpl, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "U:a\nU:b\n"


def test_tokenizer_passes_special_tokens(tmp_path):
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a"],
            "tokenizer.ggml.token_type": [2, 3, 3, 1],
            "tokenizer.chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.apply_chat_template([{"role": "user", "content": "a"}]) == "<s>a</s>"


TOOL_USE = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{{ messages[0].content }}"


def test_named_tool_use_template(tmp_path):
    """A model's named "tool_use" template renders conversations given tools (as transformers picks
    it): GGUF's tokenizer.chat_template.tool_use, tokenizer_config.json's list of named templates,
    additional_chat_templates/tool_use.jinja."""
    tools, msgs = [{"type": "function", "function": {"name": "f"}}], [{"role": "user", "content": "a"}]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a"],
            "tokenizer.ggml.token_type": [2, 3, 3, 1], "tokenizer.chat_template": "D:{{ messages[0].content }}",
            "tokenizer.chat_template.tool_use": TOOL_USE}
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.apply_chat_template(msgs, tools=tools) == "[f]a" and tok.apply_chat_template(msgs) == "D:a"
    src = os.path.join(os.path.dirname(__file__), "fixtures", "tiny_qwen3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), tmp_path / name)
    with open(tmp_path / "tokenizer_config.json") as f:
        cfg = json.load(f)
    cfg["chat_template"] = [{"name": "default", "template": "D:{{ messages[0].content }}"},
                            {"name": "tool_use", "template": TOOL_USE}]
    with open(tmp_path / "tokenizer_config.json", "w") as f:
        json.dump(cfg, f)
    tok = Tokenizer.from_hf_dir(str(tmp_path))
    assert tok.apply_chat_template(msgs, tools=tools) == "[f]a" and tok.apply_chat_template(msgs) == "D:a"
    del cfg["chat_template"]
    with open(tmp_path / "tokenizer_config.json", "w") as f:
        json.dump(cfg, f)
    (tmp_path / "chat_template.jinja").write_text("J:{{ messages[0].content }}")
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_USE)
    tok = Tokenizer.from_hf_dir(str(tmp_path))
    assert tok.apply_chat_template(msgs, tools=tools) == "[f]a" and tok.apply_chat_template(msgs) == "J:a"


@pytest.mark.parametrize("messages,field", [
    (None, "messages"),
    ({"role": "user"}, "messages"),
    ([{"role": "user", "content": "a"}, "hi"], "messages[1]"),
    ([{"content": "a"}], "messages[0].role"),
    ([{"role": 3, "content": "a"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user"}], "messages[0].content: required"),
    ([{"role": "system", "content": "s"}, {"role": "tool", "content": None}], "messages[1].content: required"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "text", "text": 1}]}], "messages[0].content[0]"),
    ([{"role": "assistant", "content": "", "tool_calls": "x"}], "messages[0].tool_calls"),
])
def test_invalid_messages(messages, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        render_chat(None, messages)


def test_invalid_tools():
    with pytest.raises(ValueError, match="tools"):
        render_chat(None, [{"role": "user", "content": "a"}], tools="nope")


@pytest.mark.parametrize("tpl,msg", [
    ("{% if %}", "chat template"),
    ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant roles"),
    ("{{ messages[0].content + 1 }}", "chat template"),
    ("{{ messages.append(1) }}", "unsafe"),
    ("{% for m in messages %}{{ m.nope.deeper }}{% endfor %}", "chat template"),
    ("{% for i in range(10 ** 6) %}{% endfor %}", "OverflowError: Range too big"),
    ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
])
def test_template_errors(tpl, msg):
    with pytest.raises(ValueError, match=msg):
        render_chat(tpl, [{"role": "user", "content": "a"}])


def test_messages_not_mutated():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    render_chat(None, msgs)
    assert msgs == [{"role": "user", "content": [{"type": "text", "text": "a"}]}]


@pytest.mark.parametrize("value", ["no/such/{dir}/template.jinja", "templates/{model}", "{name}.jinja",
                                   "missing-{x}.j2", "chat-{v}.JINJA2"])
def test_missing_template_file_is_an_error(value):
    """A value that looks like a path (a separator, or a .jinja / .jinja2 / .j2 name), but names no
    file, was taken as the template text itself when it held a '{' (vLLM: a path that does not exist
    is an error)."""
    with pytest.raises(ValueError, match=rf"^chat_template: {re.escape(value)} looks like a template file's "
                                         r"path, but it does not exist$"):
        load_chat_template(value)


def test_template_file_or_text(tmp_path):
    """Existing files are read (a folder is refused); text with Jinja delimiters stays a template
    whatever '/' it holds; text with neither is refused."""
    f = tmp_path / "t.jinja"
    f.write_text("F:{{ messages[0].content }}")
    assert load_chat_template(str(f)) == "F:{{ messages[0].content }}"
    with pytest.raises(ValueError, match=r"^chat_template: .* looks like a template file's path, but it is not a file"):
        load_chat_template(str(tmp_path))
    for text in ("{{ messages[0].content }}</s>", "[INST] {{ messages[0].content }} [/INST]",
                 "{% for m in messages %}{{ m.content }}/{% endfor %}.jinja"):
        assert load_chat_template(text) == text
    with pytest.raises(ValueError, match=r"^--chat-template: hello is neither a file nor a template"):
        load_chat_template("hello", "--chat-template")
    with pytest.raises(ValueError, match=r"^chat_template: line 1"):
        load_chat_template("{% if %}")


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content"])
def test_assistant_reasoning_reaches_the_template_under_both_names(key):
    """An assistant turn's reasoning sent back (vLLM's field `reasoning`, or the older
    `reasoning_content`) reaches templates that read either name, as vLLM hands it on (Qwen3's template
    reads reasoning_content: a conversation replayed from vLLM's `reasoning` lost its thinking)."""
    tpl = "{% for m in messages %}{{ m.role }}[{{ m.reasoning_content }}|{{ m.reasoning }}]{% endfor %}"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", key: "because"}]
    assert render_chat(tpl, msgs, False) == "user[|]assistant[because|because]"
    assert key in msgs[1] and len(msgs[1]) == 3     # (the caller's message is not changed)
    with pytest.raises(ValueError, match=rf"^messages\[1\]\.{key}: must be a string or null"):
        render_chat(tpl, [msgs[0], dict(msgs[1], **{key: 5})])
