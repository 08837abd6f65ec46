"""Reference tokenization + teacher-forced log-probs for the default GGUF, computed by llama.cpp.

Needs (NOT a project dependency; only for regenerating these fixtures):

    CMAKE_ARGS="-DGGML_NATIVE=off" pip install llama-cpp-python     # CPU build

Writes (see tests/fixtures/README.md):

    tests/fixtures/llamacpp_tokenize.json  {"model_sha256", "llama_cpp_python", "cases": [{"text", "ids"}]}
    tests/fixtures/llamacpp_logits.json    {"model_sha256", "llama_cpp_python", "settings", "n_vocab",
                                            "paragraphs": [{"name", "text", "ids", "argmax", "next_logprob",
                                                            "top5_ids", "top5_logprobs"}]}

    python scripts/make_llamacpp_fixtures.py [--model PATH] [--out tests/fixtures]

--model defaults to pocketcupy.model_cache.default_model_path() (what scripts/fetch_models.py prints last).
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

from reference_deps import LLAMA_CPP, need

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

TOKENIZE_TEXTS = [
    # empty / whitespace
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello  world   with    spaces",
    "trailing spaces   ",
    "\ttab\tseparated\tvalues\t",
    "line one\nline two\n",
    "\n",
    "\n\n\n",
    "para one\n\n\npara two\r\n\r\nend",
    "   leading and \t mixed \n\t whitespace",
    # accents / Latin
    "café naïve résumé über Müller mañana niño",
    "Tiếng Việt có nhiều dấu: Xin chào, tôi tên là Nguyễn.",
    "ÀÉÎÕÜ àéîõü ß Œuvre",
    # emoji
    "I love pizza 🍕🍕 and cats 🐱!",
    "family 👨‍👩‍👧‍👦 and thumbs 👍🏽 (ZWJ + skin tone)",
    "flags 🇫🇷🇯🇵🇺🇸",
    # CJK
    "我喜欢学习人工智能。",
    "日本語のテキストです。カタカナとひらがな。",
    "한국어 문장입니다. 안녕하세요!",
    # RTL / Cyrillic
    "مرحبا بالعالم",
    "שלום עולם",
    "Привет, мир! Как дела?",
    # code
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tfor (int i = 0; i < 10; i++) {\n\t\tprintf(\"%d\\n\", i);\n\t}\n\treturn 0;\n}\n",
    "x = {'a': [1, 2, 3], \"b\": None}  # comment",
    "<div class=\"x\">&nbsp;</div>",
    # numbers
    "1234567",
    "3.14159",
    "1,000,000",
    "The year 2024 had 366 days; 0.5% of 10^6 is 5000.",
    # contractions / case
    "don't",
    "I'll be there, you're late, it's fine, we've done it",
    "WE'RE SHOUTING AND DON'T CARE",
    # URLs
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
    "email me at someone@example.com",
    # chat special tokens written in text
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
]

PARAGRAPHS = [
    ("prose", (
        "The lighthouse keeper had lived alone on the island for nearly thirty years. Every evening, "
        "just before the sun slipped beneath the horizon, he climbed the spiral staircase to light the "
        "great lamp. Ships passing in the night relied on its steady beam to avoid the jagged rocks "
        "that lay hidden beneath the waves. He rarely received visitors, but once a month a small boat "
        "brought supplies from the mainland: flour, coffee, oil for the lamp, and a bundle of letters "
        "from his sister, who never stopped asking when he would finally come home."
    )),
    ("science", (
        "Photosynthesis is the process by which green plants, algae, and some bacteria convert light "
        "energy into chemical energy. During this process, carbon dioxide and water are combined to "
        "produce glucose and oxygen. The reaction takes place mainly in the chloroplasts, which contain "
        "the pigment chlorophyll. Chlorophyll absorbs light most strongly in the blue and red parts of "
        "the spectrum and reflects green light, which is why most plants appear green to our eyes. "
        "Without photosynthesis, there would be almost no oxygen in the atmosphere."
    )),
    ("code", (
        "import math\n\n\ndef is_prime(n: int) -> bool:\n    \"\"\"Return True if n is a prime number.\"\"\"\n"
        "    if n < 2:\n        return False\n    for d in range(2, int(math.sqrt(n)) + 1):\n"
        "        if n % d == 0:\n            return False\n    return True\n\n\n"
        "def primes_up_to(limit: int) -> list[int]:\n    return [n for n in range(limit + 1) if is_prime(n)]\n\n\n"
        "if __name__ == \"__main__\":\n    print(primes_up_to(50))\n"
    )),
    ("chat", (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France, and what is it famous for?<|im_end|>\n"
        "<|im_start|>assistant\nThe capital of France is Paris. It is famous for the Eiffel Tower, the "
        "Louvre Museum, which houses the Mona Lisa, and its cafés, fashion, and cuisine. Paris is also "
        "known as the City of Light because it was one of the first cities in Europe to use street "
        "lighting.<|im_end|>\n<|im_start|>user\nThanks! Can you name two other large French cities?<|im_end|>\n"
        "<|im_start|>assistant\nSure! Two other large French cities are Marseille and Lyon.<|im_end|>\n"
    )),
    ("list", (
        "How to make a simple cup of tea:\n\n1. Boil fresh water in a kettle.\n2. Warm the teapot by "
        "rinsing it with a little hot water.\n3. Add one teaspoon of loose tea (or one tea bag) per cup.\n"
        "4. Pour the boiling water over the tea and let it steep for three to five minutes.\n"
        "5. Strain the tea into cups, and add milk, sugar, or lemon to taste.\n\n"
        "Green tea should be brewed with water that is slightly cooler, around 80 degrees Celsius, "
        "otherwise it can taste bitter."
    )),
]

N_CTX = 2048
N_THREADS = 2
SEED = 0


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def r5(a) -> list:
    return [round(float(v), 5) for v in a]


def dump(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: pocketcupy.model_cache.default_model_path())")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    args = ap.parse_args()

    llama_cpp = need("llama_cpp", LLAMA_CPP)
    Llama = llama_cpp.Llama

    if args.model is None:
        from pocketcupy.model_cache import default_model_path

        args.model = default_model_path()
    sha = sha256_file(args.model)
    version = llama_cpp.__version__
    print(f"model {args.model} sha256 {sha}; llama-cpp-python {version}")

    llm = Llama(model_path=args.model, logits_all=True, n_ctx=N_CTX, n_threads=N_THREADS, seed=SEED, verbose=False)
    n_vocab = llm.n_vocab()

    # ---- tokenization
    cases = []
    for text in TOKENIZE_TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        cases.append({"text": text, "ids": [int(i) for i in ids]})
        # round trip through llama.cpp's detokenizer (sanity only)
        back = llm.detokenize(ids, special=True).decode("utf-8", errors="replace")
        if back != text:
            print(f"  note: detokenize != text for {text!r}: {back!r}")
    assert cases[0]["ids"] == []
    dump(os.path.join(args.out, "llamacpp_tokenize.json"),
         {"model_sha256": sha, "llama_cpp_python": version,
          "tokenize_call": "llm.tokenize(text.encode('utf-8'), add_bos=False, special=True)",
          "cases": cases})

    # ---- teacher-forced log-probs
    paragraphs = []
    for name, text in PARAGRAPHS:
        ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)]
        assert 80 <= len(ids) <= 220, (name, len(ids))
        llm.reset()
        llm.eval(ids)
        assert llm.n_tokens == len(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
        assert logits.shape == (len(ids), n_vocab)
        assert np.isfinite(logits).all(), name
        lp = log_softmax64(logits)
        argmax = lp.argmax(axis=-1)
        top5 = np.argsort(-lp, axis=-1, kind="stable")[:, :5]
        nxt = lp[np.arange(len(ids) - 1), ids[1:]]
        agree = float((argmax[:-1] == np.asarray(ids[1:])).mean())
        print(f"  {name}: {len(ids)} tokens, argmax==next {agree:.1%}, mean next logprob {nxt.mean():.3f}")
        paragraphs.append({
            "name": name,
            "text": text,
            "ids": ids,
            "argmax": [int(i) for i in argmax],
            "next_logprob": r5(nxt),
            "top5_ids": [[int(i) for i in row] for row in top5],
            "top5_logprobs": [r5(lp[p, top5[p]]) for p in range(len(ids))],
            "argmax_agreement": round(agree, 4),
        })
    out = os.path.join(args.out, "llamacpp_logits.json")
    dump(out, {"model_sha256": sha, "llama_cpp_python": version, "n_vocab": int(n_vocab),
               "settings": {"n_ctx": N_CTX, "n_threads": N_THREADS, "seed": SEED, "logits_all": True,
                            "add_bos": False, "special": True,
                            "note": "each paragraph: llm.reset(); llm.eval(ids); log_softmax(float64(llm.scores))"},
               "paragraphs": paragraphs})
    print(f"wrote {out} ({os.path.getsize(out) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
