"""Per-token structure flags: which tokens are whitespace, punctuation, JSON, code, ...

A gate feature needs to know what kind of text a draft and the context tail are made of
(drafts break at changed arguments: digits, quoted values, ids). The flags are computed
once per tokenizer from each token's decoded text and stored as a bit mask per token id
(uint16), so features look them up with one array index.
"""

from __future__ import annotations

import re

import numpy as np

FLAG_NAMES = (
    "newline",    # contains a line break
    "space",      # whitespace only (indentation, blank)
    "word_start", # a leading space then visible text (a new word)
    "alpha",      # has letters
    "upper",      # first letter is upper case
    "digit",      # has digits
    "punct",      # . , ; : ! ?
    "bracket",    # ( ) [ ] { } < >
    "quote",      # " ' `
    "json",       # JSON structure: {" "} ": ", [" "]
    "code",       # code-ish: = ; _ # -> :: ``` and tabs/indentation runs
    "special",    # a special token (end of turn, tool-call markers, ...)
)
FLAG_BITS = {name: 1 << i for i, name in enumerate(FLAG_NAMES)}
_JSON = re.compile(r'\{"|"\}|":|",|\["|"\]|^\s*[{}\[\]]\s*$')
_CODE = re.compile(r"[=;_#\\|&]|->|::|```|\t|^ {2,}$")


def flags_of(text: str, special: bool = False) -> int:
    bits = 0
    stripped = text.strip()
    if "\n" in text or "\r" in text:
        bits |= FLAG_BITS["newline"]
    if text and not stripped:
        bits |= FLAG_BITS["space"]
    if text.startswith(" ") and stripped:
        bits |= FLAG_BITS["word_start"]
    letters = [c for c in text if c.isalpha()]
    if letters:
        bits |= FLAG_BITS["alpha"]
        if letters[0].isupper():
            bits |= FLAG_BITS["upper"]
    if any(c.isdigit() for c in text):
        bits |= FLAG_BITS["digit"]
    if any(c in ".,;:!?" for c in text):
        bits |= FLAG_BITS["punct"]
    if any(c in "()[]{}<>" for c in text):
        bits |= FLAG_BITS["bracket"]
    if any(c in "\"'`" for c in text):
        bits |= FLAG_BITS["quote"]
    if _JSON.search(text):
        bits |= FLAG_BITS["json"]
    if _CODE.search(text):
        bits |= FLAG_BITS["code"]
    if special or "tool_call" in text or "tool_response" in text:
        bits |= FLAG_BITS["special"]
    return bits


def build_token_flags(token_texts: list[str], special_ids: set[int]) -> np.ndarray:
    """``[vocab_size] uint16`` flag mask per token id."""
    return np.array([flags_of(t, i in special_ids) for i, t in enumerate(token_texts)], dtype=np.uint16)


def unpack(flags: np.ndarray) -> np.ndarray:
    """``[...]`` uint16 masks -> ``[..., len(FLAG_NAMES)]`` float32 0/1."""
    return ((flags[..., None].astype(np.int32) >> np.arange(len(FLAG_NAMES))) & 1).astype(np.float32)
