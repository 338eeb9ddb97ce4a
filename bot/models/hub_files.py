"""Which files of a Hugging Face model repository a pull fetches (``bot.models.pull``).

A repository holds much more than the engine loads: the same weights in other
formats (PyTorch pickles, ONNX, GGUF, ``original/`` checkpoints), training
state, images, a README. vLLM and the tokenizer need only the configuration,
the tokenizer's files, the chat template and the weights, and safetensors
weights are plain tensors, where a pickle (``*.bin``, ``*.pt``) can run any
code its author put in it the moment it is loaded. So the weights fetched are
the repository's top-level safetensors; pickled weights only when there are no
safetensors, and only when the operator allows them (``--allow-pickle``).
"""

from __future__ import annotations

import fnmatch

from bot.models.folders import PullError

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
SAFETENSORS = ("*.safetensors", "model.safetensors.index.json")
CONSOLIDATED = "consolidated*.safetensors"
"""Mistral's repositories carry their weights twice: sharded, and in one file of their own
format. The sharded ones are what transformers and vLLM load by default."""
PICKLES = ("pytorch_model*.bin", "pytorch_model.bin.index.json")


def _matching(files: list[str], patterns: tuple[str, ...]) -> list[str]:
    return [name for name in files if any(fnmatch.fnmatchcase(name, p) for p in patterns)]


def needed_files(files: list[str], allow_pickle: bool) -> list[str]:
    """The files of ``files`` (a repository's, by path) a model folder needs, sorted.

    ``PullError`` for a repository without weights the engine may load: none at
    all, or pickles only without ``allow_pickle``.
    """
    top = [name for name in files if "/" not in name]  # subfolders: other formats, extras
    wanted = _matching(top, CONFIG_FILES + TOKENIZER_FILES + CHAT_TEMPLATE_FILES)
    weights = _matching(top, SAFETENSORS)
    sharded = [name for name in weights if not fnmatch.fnmatchcase(name, CONSOLIDATED)]
    if any(name.endswith(".safetensors") for name in sharded):
        weights = sharded
    if not any(name.endswith(".safetensors") for name in weights):
        pickles = _matching(top, PICKLES)
        if not pickles:
            raise PullError(
                "the repository has no model weights this service can load (*.safetensors)"
            )
        if not allow_pickle:
            raise PullError(
                "the repository has only pickled weights (*.bin), which can run code when "
                "loaded; pass --allow-pickle if you trust its publisher"
            )
        weights = pickles
    if "config.json" not in wanted:
        raise PullError("the repository has no config.json: it is not a transformers model")
    return sorted(wanted + weights)
