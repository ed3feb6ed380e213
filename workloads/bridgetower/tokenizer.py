"""Tokenizers: the real RoBERTa tokenizer of a checkpoint, or a deterministic local one for ``tiny``.

The local tokenizer is byte-level BPE with RoBERTa's special tokens and no merges: every byte is one
token. It is built in code (no download, no training), so it is identical on every machine, and it
works with transformers 4.55.x and 5.x alike (``PreTrainedTokenizerFast(tokenizer_object=...)``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from suite.errors import SuiteError

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # RoBERTa's ids 0..3
MASK_TOKEN = "<mask>"


def build_byte_level_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    vocab[MASK_TOKEN] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.RobertaProcessing(("</s>", vocab["</s>"]), ("<s>", vocab["<s>"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        cls_token="<s>", sep_token="</s>", mask_token=MASK_TOKEN,
    )


def load_pretrained_tokenizer(name_or_path: str) -> Any:
    """The checkpoint's own tokenizer (RoBERTa for BridgeTower), from a local path or the hub."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except Exception as exc:  # noqa: BLE001 - re-raised with what to do
        raise SuiteError(
            f"cannot load the tokenizer of {name_or_path!r} ({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); "
            "give --weights a local checkpoint folder that holds the tokenizer files, or run with network access"
        ) from exc


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the tokenizer's full serialized definition (vocab, merges, normalizers...)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()
