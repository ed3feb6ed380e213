"""Tokenizers: the real RoBERTa tokenizer of a checkpoint, or a deterministic local one.

The local tokenizer is byte-level BPE with RoBERTa's special tokens and no merges: every byte is one
token. It is built in code (no download, no training), so it is identical on every machine, and it
works with transformers 4.55.x and 5.x alike (``PreTrainedTokenizerFast(tokenizer_object=...)``).

For a preset whose checkpoint's tokenizer is not on this machine (air-gapped clusters, ``HF_HUB_OFFLINE=1``), the
same construction padded to the checkpoint's vocabulary size is a stand-in: RoBERTa's special-token ids (``<s>`` 0,
``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` last), every id below the model's vocabulary size, the same maximum
length and padding, so the model computes on tensors of the same shapes as with the real vocabulary. Which one ran
is recorded (:func:`resolve_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from suite.config import TOKENIZER_MODES
from suite.errors import SuiteError

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # RoBERTa's ids 0..3
MASK_TOKEN = "<mask>"




def build_byte_level_tokenizer(vocab_size: int | None = None) -> Any:
    """Byte-level BPE without merges; with ``vocab_size``, padded with unused tokens to that size (``<mask>`` last,
    as RoBERTa's), the offline stand-in for a checkpoint's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    if vocab_size is not None:
        if vocab_size < len(vocab) + 1:
            raise SuiteError(f"a stand-in tokenizer needs a vocabulary of at least {len(vocab) + 1}, got {vocab_size}")
        for index in range(len(vocab), vocab_size - 1):
            vocab[f"<unused{index}>"] = index
    vocab[MASK_TOKEN] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.RobertaProcessing(("</s>", vocab["</s>"]), ("<s>", vocab["<s>"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        cls_token="<s>", sep_token="</s>", mask_token=MASK_TOKEN,
    )


def load_pretrained_tokenizer(name_or_path: str, local_files_only: bool = False) -> Any:
    """The checkpoint's own tokenizer (RoBERTa for BridgeTower), from a local path, the hub cache or the hub."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=local_files_only)
    except Exception as exc:  # re-raised with what to do
        raise SuiteError(
            f"cannot load the tokenizer of {name_or_path!r} "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); "
            "give --weights a local checkpoint folder that holds the tokenizer files, or run with network access"
        ) from exc


def resolve_tokenizer(preset_tokenizer: str, vocab_size: int, weights: str | None, mode: str = "auto"
                      ) -> tuple[Any, str]:
    """(tokenizer, what it is) for a preset: the local byte-level one for presets built on it; with ``weights``,
    always the checkpoint's own; else (``auto``) the preset checkpoint's when it is on this machine (a local path
    or the hub cache; the network is not tried), or the stand-in of its vocabulary size; ``hub`` insists on the
    checkpoint's, fetched if needed (a clear error offline)."""
    if mode not in TOKENIZER_MODES:
        raise SuiteError(f"--tokenizer {mode!r}: choose one of {', '.join(TOKENIZER_MODES)}")
    if preset_tokenizer == "local-byte-level":
        return build_byte_level_tokenizer(), "local-byte-level"
    if weights:
        return load_pretrained_tokenizer(weights), weights
    if mode == "hub":
        return load_pretrained_tokenizer(preset_tokenizer), preset_tokenizer
    try:
        return load_pretrained_tokenizer(preset_tokenizer, local_files_only=True), preset_tokenizer
    except SuiteError:
        return build_byte_level_tokenizer(vocab_size), stand_in_name(vocab_size)


def stand_in_name(vocab_size: int) -> str:
    return f"local-stand-in (vocab {vocab_size})"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the tokenizer's full serialized definition (vocab, merges, normalizers...), without the truncation
    and padding a call last set on it (run-time arguments, recorded as max_seq_length): the same tokenizer has the
    same fingerprint before and after use."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        text = repr(sorted(tokenizer.get_vocab().items()))
    else:
        definition = json.loads(backend.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
        text = json.dumps(definition, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


#: Bump when the cached tensors' meaning changes (padding mode, dtype...).
TOKENS_CACHE_VERSION = 1


#: Captions tokenized per call of the tokenizer (its memory grows with the captions of one call).
TOKENIZE_CHUNK = 4096


def tokenize_captions(tokenizer: Any, captions: list[str], max_length: int, tokenizer_sha256: str | None = None
                      ) -> tuple[dict[str, Any], bool]:
    """``input_ids`` and ``attention_mask`` of ``captions`` as the reference makes them (``max_length`` padding,
    truncation); (tensors, whether they came from the cache). Cached under ``$SUITE_CACHE_DIR/bridgetower/tokens/``
    by (tokenizer fingerprint, sha256 of the captions in order, max length): the captions are exactly what is
    tokenized, so a changed image does not re-tokenize and any changed caption does."""
    import os
    import tempfile
    from pathlib import Path

    import torch

    from suite.fileio import cache_root

    captions_sha = hashlib.sha256(json.dumps(captions).encode()).hexdigest()
    key = json.dumps({"version": TOKENS_CACHE_VERSION,
                      "tokenizer": tokenizer_sha256 or tokenizer_fingerprint(tokenizer),
                      "captions": captions_sha, "count": len(captions), "max_length": max_length})
    path = cache_root() / "bridgetower" / "tokens" / f"{hashlib.sha256(key.encode()).hexdigest()}.pt"
    try:
        cached = torch.load(path, weights_only=True)
        if (isinstance(cached, dict) and cached.get("key") == key
                and tuple(cached["input_ids"].shape) == (len(captions), max_length)):
            return {"input_ids": cached["input_ids"], "attention_mask": cached["attention_mask"]}, True
    except Exception:  # noqa: BLE001 - absent, partial or foreign: tokenize again
        pass
    tensors = {"input_ids": torch.empty((len(captions), max_length), dtype=torch.long),
               "attention_mask": torch.empty((len(captions), max_length), dtype=torch.long)}
    # in chunks: the tokenizer keeps a rich Encoding per caption while a call lasts (~7 KB each here), so one call
    # over a million captions took gigabytes; each caption is padded and truncated on its own, so chunks change
    # nothing in the result
    for start in range(0, len(captions), TOKENIZE_CHUNK):
        chunk = captions[start:start + TOKENIZE_CHUNK]
        encoded = tokenizer(chunk, max_length=max_length, padding="max_length", truncation=True, return_tensors="pt")
        for name in tensors:
            tensors[name][start:start + len(chunk)] = encoded[name]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save({"key": key, **tensors}, fh)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass  # a cache that cannot be written is only a slower next run
    return tensors, False
