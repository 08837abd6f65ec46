"""strict: true functions under tool_choice "auto" in Mistral's and DeepSeek's call forms, through a
real server: a tiny random-weight model whose tokenizer has the call marker as a special token
(tests/marker_model.py), served with the style's chat template, writes the marker where logit_bias
pushes it. From the marker on the call is constrained (the function's name, its arguments per its
parameters, the style's other markers: [ARGS] and <｜tool▁sep｜> are special tokens here too, the
others text); without the constraint the model only wrote the marker again, and no call came back."""
import os

import pytest

from pocketcupy.server.tools_deepseek import CALLS_BEGIN, SEP
from pocketcupy.server.tools_mistral import ARGS, BOT
from tests.marker_model import MARKER_ID, with_markers
from tests.test_server_harness import ROOT, openai_client, serving
from tests.test_server_tools import ASK, strict_call
from tests.test_tools_mistral import V11_TEMPLATE

TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
STYLES = {  # style: (the chat template, the markers that are special tokens: the call start's first)
    "mistral-v3": (os.path.join(TEMPLATES, "mistral-7b-instruct-v0.3.jinja"), BOT),
    "mistral-v11": (V11_TEMPLATE, BOT, ARGS),
    "deepseek-v3.1": (os.path.join(TEMPLATES, "deepseek-v3.1.jinja"), CALLS_BEGIN, SEP),
}


@pytest.fixture(scope="module", params=sorted(STYLES))
def styled_client(request, tmp_path_factory):
    template, *markers = STYLES[request.param]
    model = with_markers(str(tmp_path_factory.mktemp("marker") / "model"), *markers)
    for server in serving(model, "--chat-template", template):
        with openai_client(server) as client:   # (closed before the server stops: no keep-alive to wait out)
            yield client


def test_strict_call_after_the_marker(styled_client):
    """One call (parallel_tool_calls false) whose arguments follow the strict schema."""
    strict_call(styled_client, ASK, max_tokens=150, logit_bias={str(MARKER_ID): 100}, parallel_tool_calls=False)
