"""The official openai client against a real uvicorn: completions, chat, streaming, usage,
prefix-cache reporting, and equality with the offline LLM API."""

from __future__ import annotations

import random
from pathlib import Path

import openai
import pytest

from tests.server.conftest import MODEL_NAME, Served, engine_options
from tt_serve import LLM, SamplingParams


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models(server: Served) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_completion_and_usage(server: Served) -> None:
    r = client(server).completions.create(
        model=MODEL_NAME, prompt="Hello, 世界! 👋", max_tokens=8, temperature=0
    )
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r.choices[0].text, str)
    assert r.usage is not None and r.usage.completion_tokens >= 1
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_completion_with_usage(server: Served) -> None:
    c = client(server)
    stream = c.completions.create(
        model=MODEL_NAME,
        prompt="Stream me",
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    whole = c.completions.create(model=MODEL_NAME, prompt="Stream me", max_tokens=10, temperature=0)
    assert text == whole.choices[0].text


def test_chat_and_streamed_chat(server: Served) -> None:
    c = client(server)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    r = c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=6, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    content = r.choices[0].message.content or ""
    stream = c.chat.completions.create(
        model=MODEL_NAME,
        messages=msgs,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        if ch.usage is not None:
            usage = ch.usage
    assert "".join(parts) == content
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens  # type: ignore[union-attr]


def test_http_greedy_equals_offline_llm(server: Served, demo_dir: Path) -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 200000) for _ in range(150)]
    c = client(server)
    r = c.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        logprobs=2,
        extra_body={"return_token_ids": True},
    )
    opts = engine_options(demo_dir)
    llm = LLM(
        demo_dir,
        block_size=opts.block_size,
        prefill_chunk=opts.prefill_chunk,
        kv_blocks=256,
        snapshot_slots=4,
        max_model_len=opts.max_model_len,
    )
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0))
    choice = r.choices[0].model_dump()
    assert choice["token_ids"] == out.token_ids
    assert choice["prompt_token_ids"] == prompt
    assert r.choices[0].text == out.text
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == 12
    streamed: list[int] = []
    for ch in c.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True},
    ):
        if ch.choices:
            streamed.extend(ch.choices[0].model_dump().get("token_ids") or [])
    assert streamed == out.token_ids


def test_shared_prefix_reports_cached_tokens(server: Served) -> None:
    c = client(server)
    rng = random.Random(1)
    head = [rng.randrange(1000, 200000) for _ in range(300)]
    first = c.completions.create(
        model=MODEL_NAME, prompt=head + [11, 12], max_tokens=2, temperature=0
    )
    second = c.completions.create(
        model=MODEL_NAME, prompt=head + [13, 14, 15], max_tokens=2, temperature=0
    )
    assert first.usage is not None and second.usage is not None
    details = second.usage.prompt_tokens_details
    # Both prompts are cut one block (16) before their ends, at 288, and share the tokens up to
    # there: the second resumes at the first's prompt-end snapshot (chunk multiples alone: 256).
    assert details is not None and details.cached_tokens == 288


def test_seeded_sampling_over_http(server: Served) -> None:
    c = client(server)

    def go(seed: int) -> str:
        r = c.completions.create(
            model=MODEL_NAME, prompt="seed", max_tokens=8, temperature=1.0, seed=seed
        )
        return r.choices[0].text

    assert go(7) == go(7)


def test_n_choices_and_prompt_lists(server: Served) -> None:
    r = client(server).completions.create(
        model=MODEL_NAME, prompt=["a", "b"], n=2, max_tokens=3, temperature=0
    )
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy: the same prompt gives the same text


@pytest.mark.parametrize("stop_at", [1, 2])
def test_stop_strings_trim_output(server: Served, stop_at: int) -> None:
    c = client(server)
    full = (
        c.completions.create(model=MODEL_NAME, prompt="stop test", max_tokens=12, temperature=0)
        .choices[0]
        .text
    )
    if len(full) < 4:
        pytest.skip("the random model produced too little text for a stop string")
    stop = full[stop_at : stop_at + 2]
    r = c.completions.create(
        model=MODEL_NAME, prompt="stop test", max_tokens=12, temperature=0, stop=[stop]
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(stop)]
