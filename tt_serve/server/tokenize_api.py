"""``POST /tokenize`` and ``/detokenize`` for clients that count tokens themselves, in vLLM's shape
(``prompt`` or chat ``messages`` -> ``tokens``, ``count``, ``max_model_len``; ``tokens`` ->
``prompt``) and llama.cpp's (``content`` -> ``tokens``; ``tokens`` -> ``content``): both
field names are read and answered. Chat messages render through ``ServingChat``'s path, so the
count is the prompt a chat request would send.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tt_serve.server.protocol import APIError, ChatCompletionRequest, ChatMessage
from tt_serve.server.serving import ServingChat
from tt_serve.server.state import ServerState


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: str | None = None
    content: str | None = None  # llama.cpp's name
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)


def tokenize_body(chat: ServingChat, body: TokenizeRequest) -> JSONResponse:
    chat._engine(body.model)
    tok = chat.state.tokenizer
    if tok is None:
        raise APIError(400, "this model ships no tokenizer")
    given = [x for x in (body.prompt, body.content, body.messages) if x is not None]
    if len(given) != 1:
        raise APIError(400, "send exactly one of prompt, content or messages")
    if body.messages is not None:
        try:
            request = ChatCompletionRequest(
                messages=body.messages,
                tools=body.tools,
                add_generation_prompt=body.add_generation_prompt,
                chat_template_kwargs=body.chat_template_kwargs,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ()))
            raise APIError(400, f"{loc}: {first.get('msg')}", param=loc or None) from exc
        ids = chat.prompts(request).token_ids[0]
    else:
        text = body.prompt if body.prompt is not None else body.content
        assert text is not None
        ids = tok.encode(text, add_special_tokens=body.add_special_tokens)
    return JSONResponse(
        {"tokens": ids, "count": len(ids), "max_model_len": chat.state.max_model_len}
    )


def detokenize_body(state: ServerState, body: DetokenizeRequest) -> JSONResponse:
    if state.tokenizer is None:
        raise APIError(400, "this model ships no tokenizer")
    if body.model and body.model != state.model_name:
        raise APIError(404, f"model {body.model!r} does not exist", type="not_found_error")
    vocab = state.tokenizer.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(
            400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="tokens"
        )
    text = state.tokenizer.decode(body.tokens, skip_special_tokens=False)
    return JSONResponse({"prompt": text, "content": text})
