"""Build the offline demo model: a tiny Llama with random weights.

Nothing is downloaded. The tokenizer is a byte-level BPE trained here on a
small built-in corpus, the chat template is ChatML, and the weights come from a
seeded random initialisation, so the same seed always gives the same folder.

The model babbles: it exists so that the whole service (vLLM, prefix cache,
streaming, storage) runs end to end on a laptop CPU in seconds. Point
``engine.model`` at a real chat model for real answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEMO_VOCAB_SIZE = 2048
DEMO_HIDDEN_SIZE = 128
DEMO_LAYERS = 2
DEMO_HEADS = 2
DEMO_MAX_POSITIONS = 4096
DEMO_SEED = 1234

BOS_TOKEN = "<|begin_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of a turn; doubles as the model's EOS
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, IM_START, IM_END]

# ChatML, the same shape many open chat models use. Earlier turns are
# rendered verbatim, which is what token-exact history relies on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A few paragraphs of plain English so the BPE learns ordinary words.
_CORPUS = """\
Hello! How are you today? I am fine, thank you. What can I do for you?
The quick brown fox jumps over the lazy dog.
A journey of a thousand miles begins with a single step.
Please tell me about the weather in Paris, London, Berlin and Tokyo this week.
You are a helpful assistant. Answer briefly and politely, and ask when something is unclear.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2026. Dates like 2026-11-30 and times like 12:30.
Code: def main(): return print("hello world") if x > 0 else None; for i in range(10): pass
Markdown: **bold**, _italic_, `code`, # Heading, - list item, 1. numbered item, [link](url).
Questions and answers, greetings and farewells, thanks, apologies, and small talk about the day.
Ünïcödé, émojis 🙂 and accents: café, naïve, façade, jalapeño, Straße, Zürich, Kraków.
"""


def _train_tokenizer(vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so that merges have counts to work with; the trainer
    # is deterministic for a fixed input.
    tokenizer.train_from_iterator([_CORPUS] * 20, trainer=trainer)
    return tokenizer


def _token_id(tokenizer: Any, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise TypeError(f"special token {token!r} has no single id")
    return token_id


def build_demo_model(target: Path, seed: int = DEMO_SEED) -> Path:
    """Write a loadable Hugging Face model folder at ``target`` and return it.

    The folder holds ``config.json``, ``model.safetensors``, the tokenizer
    files and the chat template. An existing complete folder is left alone.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target = Path(target)
    marker = target / "demo_model.json"
    if marker.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)

    raw = _train_tokenizer(DEMO_VOCAB_SIZE)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=raw,
        bos_token=BOS_TOKEN,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(target)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=DEMO_VOCAB_SIZE,
        hidden_size=DEMO_HIDDEN_SIZE,
        intermediate_size=DEMO_HIDDEN_SIZE * 2,
        num_hidden_layers=DEMO_LAYERS,
        num_attention_heads=DEMO_HEADS,
        num_key_value_heads=DEMO_HEADS,
        max_position_embeddings=DEMO_MAX_POSITIONS,
        bos_token_id=_token_id(tokenizer, BOS_TOKEN),
        eos_token_id=_token_id(tokenizer, IM_END),
        pad_token_id=_token_id(tokenizer, PAD_TOKEN),
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(target, safe_serialization=True)
    # Written last: its presence means the folder is complete.
    marker.write_text(json.dumps({"seed": seed, "vocab_size": DEMO_VOCAB_SIZE}) + "\n")
    return target
