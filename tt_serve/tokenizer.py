"""Text in and out of token ids: tokenizer, incremental detokenizer, stop strings, chat template.

* ``Tokenizer`` loads an HF model directory's ``tokenizer.json`` through the ``tokenizers``
  package, plus ``tokenizer_config.json`` (special tokens, chat template) and
  ``generation_config.json`` (extra end-of-sequence ids).
* ``IncrementalDetokenizer`` turns a stream of generated ids into text deltas that never split a
  UTF-8 character (byte-level BPE tokens often hold part of one).
* ``StopMatcher`` finds stop strings across delta boundaries and trims them.
* ``Tokenizer.apply_chat_template`` renders OpenAI-style messages with the directory's jinja2
  chat template in a sandbox, or with the built-in ChatML template when none is shipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

# ChatML, plus Qwen3.5's rendering of tools (a system turn listing them with the XML call
# format), of assistant tool calls, of tool results (consecutive ones in one user turn) and of
# the think block (``enable_thinking``: True opens one, False renders it empty and closed; when
# it is undefined nothing is added). Plain conversations render exactly as bare ChatML.
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format "
    "with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n"
    "<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n</tool_call>' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- '\\n\\n' + messages[0]['content'] }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if loop.first and tools and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and (message.get('tool_calls') or "
    "message.get('reasoning_content')) %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.get('reasoning_content') %}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message['content'] }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- if loop.first and message['content'] %}{{- '\\n\\n' }}"
    "{%- elif not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n<function=' + call['function']['name'] + '>\\n' }}"
    "{%- for key, value in (call['function']['arguments'] or {}) | items %}"
    "{{- '<parameter=' + key + '>\\n' }}"
    "{%- if value is mapping or (value is iterable and value is not string) %}"
    "{{- value | tojson }}{%- else %}{{- value | string }}{%- endif %}"
    "{{- '\\n</parameter>\\n' }}"
    "{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking %}{{- '<think>\\n' }}"
    "{%- elif enable_thinking is defined %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
_REPLACEMENT_CHAR = "\ufffd"


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    # HF's variant: no HTML escaping and non-ASCII kept, unlike jinja2's built-in filter.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile an HF-style chat template in a sandbox (the template comes with the model)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise ValueError(f"invalid chat template: {exc}") from exc


def normalize_messages(messages: object) -> list[dict[str, Any]]:
    """Validate chat messages and return copies whose ``content`` is a plain string.

    Roles are system/user/assistant/tool; content is a string or a list of
    ``{"type": "text", "text": ...}`` parts (joined); an assistant message may have null content
    (e.g. when it only carries tool calls). Other keys pass through to the template.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be an object")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ValueError(
                f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}, got {role!r}"
            )
        out.append({**message, "content": _content_text(message.get("content"), i, role)})
    return out


def _content_text(content: object, i: int, role: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ValueError(f"messages[{i}].content[{j}] must be a text part")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"messages[{i}].content[{j}].text must be a string")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"messages[{i}].content must be a string or a list of text parts")


def _token_content(value: object) -> str | None:
    # tokenizer_config.json stores special tokens as a string or an AddedToken-like dict.
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _int_list(value: object) -> list[int]:
    # generation_config.json's eos_token_id is an int, a list of ints, or absent.
    items = value if isinstance(value, list) else [value]
    return [i for i in items if isinstance(i, int) and not isinstance(i, bool)]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _template_source(directory: Path, config: Mapping[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):
        # Named templates (HF allows a list); the chat one is called "default".
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if isinstance(template, str):
        return template
    jinja_file = directory / "chat_template.jinja"
    return jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else None


class Tokenizer:
    """An HF ``tokenizer.json`` tokenizer with the model directory's special tokens and template."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        eos_token: str | None = None,
        pad_token: str | None = None,
        bos_token: str | None = None,
        extra_eos_ids: Sequence[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self._tok = tokenizer
        self.eos_token, self.pad_token, self.bos_token = eos_token, pad_token, bos_token
        eos_ids = set(extra_eos_ids)
        if eos_token is not None:
            eos_id = tokenizer.token_to_id(eos_token)
            if eos_id is None:
                raise ValueError(f"eos token {eos_token!r} is not in the vocabulary")
            eos_ids.add(eos_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)
        self.pad_token_id = None if pad_token is None else tokenizer.token_to_id(pad_token)
        self.chat_template_source = chat_template or CHATML_TEMPLATE
        self._template = compile_chat_template(self.chat_template_source)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` (+ ``tokenizer_config.json``, ``generation_config.json``)."""
        directory = Path(path)
        tokenizer_file = directory / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {directory}")
        config = _read_json(directory / "tokenizer_config.json")
        gen_eos = _read_json(directory / "generation_config.json").get("eos_token_id")
        return cls(
            HFTokenizer.from_file(str(tokenizer_file)),
            eos_token=_token_content(config.get("eos_token")),
            pad_token=_token_content(config.get("pad_token")),
            bos_token=_token_content(config.get("bos_token")),
            extra_eos_ids=_int_list(gen_eos),
            chat_template=_template_source(directory, config),
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` text (what grammar engines load)."""
        return str(self._tok.to_str())

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        result = self._tok.token_to_id(token)
        return None if result is None else int(result)

    def id_to_token(self, token_id: int) -> str | None:
        result = self._tok.id_to_token(token_id)
        return None if result is None else str(result)

    def apply_chat_template(
        self, messages: object, *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render chat messages to a prompt string; any problem raises ``ValueError``.

        Extra keyword arguments (``tools``, ``enable_thinking``, ...) reach the template.
        """
        context = {
            **kwargs,
            "messages": normalize_messages(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
            "pad_token": self.pad_token or "",
        }
        try:
            return self._template.render(context)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template error: {exc}") from exc
        except (TypeError, KeyError, AttributeError, IndexError) as exc:
            raise ValueError(f"chat template failed on these messages: {exc!r}") from exc

    def incremental_detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(
            lambda ids: self.decode(ids, skip_special_tokens=skip_special_tokens)
        )


class IncrementalDetokenizer:
    """Token ids in, finished text out, never half a UTF-8 character.

    The prefix/read-offset technique (vLLM, TGI): decode the window ``ids[prefix:]`` and compare
    with the decode of ``ids[prefix:read]``. Only when the window decodes to more text and does
    not end in U+FFFD (an incomplete byte sequence) is the new text emitted and the window moved
    on. Decoding a short window instead of everything keeps each step O(window).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, token_ids: int | Sequence[int]) -> str:
        """Feed one or more ids; return the text they complete (may be empty)."""
        if isinstance(token_ids, int):
            self._ids.append(token_ids)
        else:
            self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) > len(prefix_text) and not text.endswith(_REPLACEMENT_CHAR):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(prefix_text) :]
        return ""

    def finish(self) -> str:
        """Flush what is held back (incomplete bytes decode to U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text) :]


class StopMatcher:
    """Trim generated text at the first stop string, even one split across deltas.

    ``feed(delta)`` returns ``(text safe to emit, stopped)``. Text that could still turn into a
    stop string is held back until the following text settles it; once a stop string is found
    everything from it on is dropped and ``stopped`` stays true.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError("stop strings must be non-empty strings")
        self.stops = tuple(dict.fromkeys(stops))
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[: min(hits)], True
        keep = self._partial_suffix_len(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def finish(self) -> str:
        """The held-back text, once generation ended without completing a stop string."""
        text, self._held = self._held, ""
        return "" if self.stopped else text

    def _partial_suffix_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best


def load_tokenizer(model_dir: str | Path) -> Tokenizer | None:
    """The model folder's tokenizer, or None when it ships none (token ids only)."""
    if not (Path(model_dir) / "tokenizer.json").exists():
        return None
    return Tokenizer.from_dir(model_dir)
