"""Sends the soak's items and records each request as an ``Exchange``: its status, whether that
status is the one expected, and for greedy requests the answer a control server must repeat.

What counts as right: a good request gets 200 (and, being ``ignore_eos``, exactly its
``max_tokens``); a bad input gets its 4xx with a JSON body carrying ``error``; a request aborted
by the client's own timeout may be cut at any point but never gets a 5xx.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.load.generator import post
from bench.soak.mix import PATHS, Conversation, Item, Single


@dataclass
class Answer:
    """What a greedy request produced: compared with the control server's answer."""

    text: str = ""
    token_ids: list[int] | None = None
    output_tokens: int = 0
    response_id: str | None = None  # the Responses API's id, which the next turn continues


@dataclass
class Exchange:
    item: int
    kind: str
    path: str
    turn: int = 0
    expect: int = 200
    status: int | None = None
    aborted: bool = False
    """The client's own timeout fired (the request's intended end)."""
    problem: str | None = None
    """Why this exchange is wrong; None when it is as expected."""
    body: dict[str, Any] | None = None
    """The JSON sent (kept for greedy requests, which are replayed)."""
    max_tokens: int = 0
    answer: Answer | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)


def _error_problem(ex: Exchange, resp: httpx.Response, names: str | None) -> str | None:
    if ex.status != ex.expect:
        return f"HTTP {ex.status}, expected {ex.expect}: {resp.text[:200]}"
    try:
        err = resp.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {ex.status} without a JSON error body: {resp.text[:200]}"
    message = err.get("message", "") if isinstance(err, dict) else str(err)
    if names is not None and names not in message:
        return f"error message does not name {names}: {message[:200]}"
    return None


def answer_of(path: str, data: dict[str, Any]) -> Answer:
    """The text, token ids (completions), output tokens and id of a whole JSON answer."""
    usage = data.get("usage") or {}
    if path == PATHS["completions"]:
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        return Answer(choice["text"], ids, int(usage.get("completion_tokens") or 0))
    if path == PATHS["chat"]:
        text = data["choices"][0]["message"].get("content") or ""
        return Answer(text, None, int(usage.get("completion_tokens") or 0))
    if path == PATHS["responses"]:
        text = "".join(
            c.get("text", "")
            for o in data.get("output") or []
            if o.get("type") == "message"
            for c in o.get("content") or []
        )
        return Answer(text, None, int(usage.get("output_tokens") or 0), data.get("id"))
    text = "".join(c.get("text", "") for c in data.get("content") or [] if c.get("type") == "text")
    return Answer(text, None, int(usage.get("output_tokens") or 0))


async def _stream(client: httpx.AsyncClient, ex: Exchange, single: Single) -> None:
    """A completions or chat stream: read to the end (TTFT, ITL, the answer), or dropped after
    ``single.drop_after`` chunks."""
    assert single.body is not None
    st = time.perf_counter()
    last, chunks = st, 0
    answer = Answer(token_ids=[])
    resp = await post(client, single.path, single.body, stream=True)
    try:
        ex.status = resp.status_code
        if resp.status_code != 200:
            await resp.aread()
            ex.problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                ex.problem = f"stream error: {json.dumps(chunk['error'])[:200]}"
                return
            now = time.perf_counter()
            if chunk.get("choices"):
                chunks += 1
                if ex.ttft is None:
                    ex.ttft = now - st
                else:
                    ex.itl.append(now - last)
                last = now
                choice = chunk["choices"][0]
                answer.text += choice.get("text") or ""
                answer.token_ids = (answer.token_ids or []) + (choice.get("token_ids") or [])
                if single.drop_after and chunks >= single.drop_after:
                    return  # the client goes away: closing the response drops the connection
            if chunk.get("usage"):
                answer.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
    finally:
        await resp.aclose()
    ex.answer = answer


async def _send(client: httpx.AsyncClient, req: httpx.Request) -> httpx.Response:
    """``req`` sent once more if a kept-alive connection was closed before any answer (as
    ``bench.load.generator.post``, for requests that are not plain JSON)."""
    try:
        return await client.send(req)
    except httpx.RemoteProtocolError:
        return await client.send(req)


async def send(client: httpx.AsyncClient, item: Item) -> Exchange:
    """One single-request item, judged."""
    single = item.single
    assert single is not None
    body = single.body
    ex = Exchange(item.index, item.kind, single.path, expect=single.expect)
    if item.greedy and body is not None:
        ex.body, ex.max_tokens = body, int(body["max_tokens"])
    try:
        if body is not None and body.get("stream"):
            await _stream(client, ex, single)
        else:
            if single.raw is not None:
                req = client.build_request(
                    "POST",
                    single.path,
                    content=single.raw,
                    headers={"content-type": "application/json"},
                )
            else:
                req = client.build_request("POST", single.path, json=body)
            timeout = httpx.Timeout(single.timeout_s) if single.timeout_s else None
            if timeout is not None:
                req.extensions["timeout"] = timeout.as_dict()
            resp = await _send(client, req)
            ex.status = resp.status_code
            if single.expect != 200:
                ex.problem = _error_problem(ex, resp, single.error_names)
            elif resp.status_code != 200:
                ex.problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
            else:
                ex.answer = answer_of(single.path, resp.json())
    except httpx.TimeoutException as exc:
        if single.timeout_s:
            ex.aborted = True
        else:
            ex.problem = f"client timeout: {type(exc).__name__}"
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        ex.problem = f"{type(exc).__name__}: {exc}"[:300]
    _check_length(ex)
    return ex


def _check_length(ex: Exchange) -> None:
    """An ``ignore_eos`` greedy answer must have exactly its ``max_tokens``."""
    a = ex.answer
    if ex.problem is None and a is not None and ex.max_tokens and a.output_tokens != ex.max_tokens:
        ex.problem = f"{a.output_tokens} output tokens, expected {ex.max_tokens}"


def turn_body(
    convo: Conversation, model: str, turn: int, history: list[str], previous_id: str | None
) -> dict[str, Any]:
    """Turn ``turn``'s request: the whole history (chat, messages) or the previous response's
    id (Responses), then the new user message; greedy, ``ignore_eos``."""
    greedy = {"temperature": 0.0, "ignore_eos": True}
    user = convo.users[turn]
    if convo.api == "responses":
        body = greedy | {
            "input": user,
            "instructions": convo.system,
            "max_output_tokens": convo.max_tokens,
            "store": True,
        }
        return body | ({"previous_response_id": previous_id} if previous_id else {})
    messages = []
    for i, answer in enumerate(history):
        messages += [
            {"role": "user", "content": convo.users[i]},
            {"role": "assistant", "content": answer},
        ]
    messages.append({"role": "user", "content": user})
    if convo.api == "messages":
        return greedy | {
            "model": model,
            "system": convo.system,
            "messages": messages,
            "max_tokens": convo.max_tokens,
        }
    system = [{"role": "system", "content": convo.system}]
    return greedy | {"messages": system + messages, "max_tokens": convo.max_tokens}


async def converse(client: httpx.AsyncClient, item: Item, model: str) -> list[Exchange]:
    """A conversation's turns in order; it stops at the first wrong turn."""
    convo = item.conversation
    assert convo is not None
    out: list[Exchange] = []
    history: list[str] = []
    previous_id: str | None = None
    for turn in range(len(convo.users)):
        body = turn_body(convo, model, turn, history, previous_id)
        path = PATHS[convo.api]
        ex = Exchange(item.index, item.kind, path, turn, body=body, max_tokens=convo.max_tokens)
        out.append(ex)
        try:
            resp = await post(client, path, body)
            ex.status = resp.status_code
            if resp.status_code != 200:
                ex.problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
            else:
                ex.answer = answer_of(path, resp.json())
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            ex.problem = f"{type(exc).__name__}: {exc}"[:300]
        _check_length(ex)
        if ex.problem is not None or ex.answer is None:
            break
        history.append(ex.answer.text)
        previous_id = ex.answer.response_id
    return out
