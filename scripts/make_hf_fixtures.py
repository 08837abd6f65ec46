"""Write tiny random-weight Hugging Face checkpoints + the logits transformers computes for them.

Needs (NOT project dependencies; only for regenerating these fixtures):

    pip install torch transformers tokenizers safetensors

Writes, under tests/fixtures/ (see tests/fixtures/README.md):

    tiny_llama/   LlamaForCausalLM, llama3 rope scaling, untied lm_head, bfloat16, one model.safetensors
    tiny_qwen3/   Qwen3ForCausalLM (q_norm/k_norm, head_dim 32 != 64/4), tied embeddings, float16, 2 shards
    tiny_qwen2/   Qwen2ForCausalLM (q/k/v biases), untied lm_head, float32, one model.safetensors
    hf_logits.npz reference float32 logits + greedy continuations for each of the three
    hf_tokenize.json  ids of the tiny tokenizer for some texts and rendered chat templates

Each folder: config.json, generation_config.json, model weights, tokenizer.json, tokenizer_config.json
(byte-level BPE trained here, ChatML chat_template, eos "<|im_end|>", no BOS).

Deterministic: seeded torch.Generator, deterministic BPE training, fixed zip timestamps in the npz;
rerunning produces byte-identical files (given the same package versions).

    python scripts/make_hf_fixtures.py [--out tests/fixtures]
"""
import argparse
import copy
import hashlib
import io
import json
import os
import shutil
import zipfile

import numpy as np

from reference_deps import HF, need

torch = need("torch", HF)
need("transformers", HF)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

VOCAB = 320  # 317 byte-level BPE tokens (256 bytes + 61 merges) + 3 special tokens at the end
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = VOCAB - 3, VOCAB - 2, VOCAB - 1

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little model that computed logits for every token.",
    "Hello, world! How are you today? I am fine, thank you.",
    "def main():\n    print('hello world')\n    return 0\n",
    "The attention of the transformer is computed on the keys and the values of the tokens.",
    "In the beginning the weights were random, and the tests were sensitive to mistakes.",
    "user: what is the capital of France?\nassistant: The capital of France is Paris.",
    "the the the and and and of of of to to to in in in is is is it it it",
]

# input id sequences (lengths 1, 7, 40) and the greedy prompt; all ids < VOCAB
INPUTS = [
    [IM_START_ID],
    [IM_START_ID, 117, 115, 101, 114, 198, 72],  # arbitrary ids incl. special
    [(i * 37 + 11) % (VOCAB - 3) for i in range(39)] + [IM_END_ID],
]
GREEDY_PROMPT = [IM_START_ID, 300, 45, 12, 250, 99, 7, 198]
GREEDY_NEW = 16

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=IM_END_ID,
    pad_token_id=ENDOFTEXT_ID,
    initializer_range=0.02,
)

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def model_specs():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    return [
        dict(name="tiny_llama", seed=1, dtype=torch.bfloat16, shard=None, cls=LlamaForCausalLM,
             rope_theta=10000.0, rope_scaling=LLAMA3_SCALING,
             config=LlamaConfig(**COMMON, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                                rope_theta=10000.0, rope_scaling=dict(LLAMA3_SCALING))),
        dict(name="tiny_qwen3", seed=2, dtype=torch.float16, shard="150KB", cls=Qwen3ForCausalLM,
             rope_theta=1000000.0, rope_scaling=None,
             config=Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True, attention_bias=False,
                                rope_theta=1000000.0, use_sliding_window=False)),
        dict(name="tiny_qwen2", seed=3, dtype=torch.float32, shard=None, cls=Qwen2ForCausalLM,
             rope_theta=1000000.0, rope_scaling=None,
             config=Qwen2Config(**COMMON, tie_word_embeddings=False, rope_theta=1000000.0,
                                use_sliding_window=False)),
    ]


# ---------------------------------------------------------------------------------------------- tokenizer
def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(TRAIN_TEXT * 4, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB - len(SPECIALS), tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)
    assert tok.get_vocab_size() == VOCAB
    for i, s in zip((ENDOFTEXT_ID, IM_START_ID, IM_END_ID), SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def write_tokenizer(tok, folder):
    tok.save(os.path.join(folder, "tokenizer.json"))
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in zip((ENDOFTEXT_ID, IM_START_ID, IM_END_ID), SPECIALS)
        },
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


TOKENIZE_TEXTS = [
    "", " ", "Hello world", " Hello  world  ", "The quick brown fox jumps over the lazy dog.",
    "line one\nline two\n\n\nend\t", "don't I'll WE'RE", "1234567 3.14159", "café über 日本語 🍕👨‍👩‍👧",
    "def main():\n    return 0\n", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more",
]
CHAT_CASES = [
    ([{"role": "user", "content": "Hello there!"}], True),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}], True),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], False),
]


def write_tokenize_fixture(out):
    """hf_tokenize.json: ids from transformers' AutoTokenizer for the tiny tokenizer (+ chat template)."""
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(os.path.join(out, "tiny_llama"))
    cases = [{"text": s, "ids": t.encode(s, add_special_tokens=False)} for s in TOKENIZE_TEXTS]
    for c in cases:
        assert t.decode(c["ids"]) == c["text"], c
    chat = []
    for messages, agp in CHAT_CASES:
        rendered = t.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
        ids = t.encode(rendered, add_special_tokens=False)
        chat.append({"messages": messages, "add_generation_prompt": agp, "rendered": rendered, "ids": ids})
    with open(os.path.join(out, "hf_tokenize.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "tiny_llama/tokenizer.json (the same file is in all three tiny_* folders)",
                   "encode_call": "AutoTokenizer.from_pretrained(folder).encode(text, add_special_tokens=False)",
                   "cases": cases, "chat": chat}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


# ---------------------------------------------------------------------------------------------- weights
def init_weights(model, seed):
    """std-0.02 normal matrices, norm weights 1 + 0.1*randn, biases 0.1*randn (all seeded, in float32)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith(".bias"):
                v = 0.1 * r
            elif "norm" in name:
                v = 1.0 + 0.1 * r
            else:
                v = 0.02 * r
            p.copy_(v.to(p.dtype))


def legacy_config(folder, spec):
    """Rewrite config.json in the layout real hub checkpoints use (rope_theta / rope_scaling / torch_dtype).

    transformers >= 5 writes `rope_parameters` instead; it still reads the legacy keys (checked by reloading).
    """
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.pop("rope_parameters", None)
    cfg["rope_theta"] = spec["rope_theta"]
    cfg["rope_scaling"] = dict(spec["rope_scaling"]) if spec["rope_scaling"] else None
    cfg["torch_dtype"] = cfg.get("dtype") or str(spec["dtype"]).replace("torch.", "")
    cfg = dict(sorted(cfg.items()))
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_generation_config(folder):
    gc = {"bos_token_id": None, "do_sample": False, "eos_token_id": IM_END_ID, "pad_token_id": ENDOFTEXT_ID}
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(gc, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------------------------- npz
def save_npz_deterministic(path, arrays):
    """Like np.savez but with fixed zip timestamps and key order, so reruns are byte-identical."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def check_greedy(model, prompt, new) -> list[float]:
    """Asserts that a cache-free argmax loop gives generate()'s tokens `new`; the top1-top2 logit
    margin at each step."""
    seq, margins = list(prompt), []
    for _ in range(len(new)):
        lg = model(input_ids=torch.tensor([seq])).logits[0, -1].numpy()
        top2 = np.sort(lg)[-2:]
        margins.append(float(top2[1] - top2[0]))
        seq.append(int(lg.argmax()))
    assert seq[len(prompt):] == new, (seq, new)
    return margins


# ---------------------------------------------------------------------------------------------- main
def make_one(spec, tok, out, arrays):
    from transformers import GenerationConfig

    name = spec["name"]
    folder = os.path.join(out, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)

    torch.manual_seed(spec["seed"])
    model = spec["cls"](spec["config"]).to(torch.float32).eval()
    init_weights(model, spec["seed"])
    model = model.to(spec["dtype"])
    kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {"max_shard_size": "100MB"}
    model.save_pretrained(folder, safe_serialization=True, **kw)
    legacy_config(folder, spec)
    write_generation_config(folder)
    write_tokenizer(tok, folder)

    # reference: reload from disk, upcast to float32 (exact), compute in float32
    ref = spec["cls"].from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    for pn, p in ref.named_parameters():
        assert p.dtype == torch.float32, pn
    assert abs(ref.config.rope_parameters["rope_theta"] - spec["rope_theta"]) < 1e-9
    if spec["rope_scaling"]:
        assert ref.config.rope_parameters["rope_type"] == "llama3", ref.config.rope_parameters
    # in-memory model (stored dtype, upcast) must agree with the reloaded one => config/weights round-trip
    # (fresh float32 module: `.to(bfloat16)` would also have rounded the non-persistent rope inv_freq buffer)
    mem_cfg = copy.deepcopy(spec["config"])
    mem_cfg._attn_implementation = "eager"
    mem = spec["cls"](mem_cfg).to(torch.float32).eval()
    assert mem.config._attn_implementation == ref.config._attn_implementation == "eager"
    mem.load_state_dict({k: v.to(torch.float32) for k, v in model.state_dict().items()}, strict=False)
    for (ka, a), (kb, b) in zip(sorted(mem.state_dict().items()), sorted(model.state_dict().items())):
        assert ka == kb and torch.equal(a, b.to(torch.float32)), ka
    with torch.no_grad():
        for k, ids in enumerate(INPUTS):
            x = torch.tensor([ids], dtype=torch.long)
            logits = ref(input_ids=x).logits[0].float().numpy()
            logits_mem = mem(input_ids=x).logits[0].float().numpy()
            assert np.array_equal(logits, logits_mem), f"{name}: reload changed logits"
            assert logits.shape == (len(ids), VOCAB) and np.isfinite(logits).all()
            arrays[f"{name}__ids{k}"] = np.asarray(ids, dtype=np.int64)
            arrays[f"{name}__logits{k}"] = logits.astype(np.float32)

        gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=GREEDY_NEW, min_new_tokens=0,
                                   eos_token_id=None, pad_token_id=ENDOFTEXT_ID, bos_token_id=None)
        x = torch.tensor([GREEDY_PROMPT], dtype=torch.long)
        out_ids = ref.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gen_cfg)
        new = out_ids[0, len(GREEDY_PROMPT):].numpy()
        assert len(new) == GREEDY_NEW, new
        margins = check_greedy(ref, GREEDY_PROMPT, new.tolist())
        arrays[f"{name}__greedy_prompt"] = np.asarray(GREEDY_PROMPT, dtype=np.int64)
        arrays[f"{name}__greedy_ids"] = new.astype(np.int64)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(f"{name}: {sorted(os.listdir(folder))} {size / 1024:.0f} KiB; greedy {new.tolist()} "
          f"min top1-top2 margin {min(margins):.2e}")
    assert size < 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)

    tok = build_tokenizer()
    arrays = {}
    for spec in model_specs():
        make_one(spec, tok, args.out, arrays)

    write_tokenize_fixture(args.out)

    import tokenizers
    import transformers
    arrays["versions"] = np.asarray(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                                                "tokenizers": tokenizers.__version__}))
    npz = os.path.join(args.out, "hf_logits.npz")
    save_npz_deterministic(npz, arrays)
    digest = hashlib.sha256(open(npz, "rb").read()).hexdigest()
    print(f"wrote {npz} ({os.path.getsize(npz) / 1024:.0f} KiB, sha256 {digest[:16]}) keys: {sorted(arrays)}")


if __name__ == "__main__":
    main()
