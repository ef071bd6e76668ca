"""bench/agent_replay: the workload (deterministic, sizes on the demo model's tokenizer, the two
answer modes), the bound and per-turn statistics, the arguments; slow: the in-process replay on
the demo model and the HTTP client against a real tt-serve app."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.agent_replay import client as C
from bench.agent_replay import harness
from bench.agent_replay import summary as S
from bench.agent_replay.records import TurnRecord
from bench.agent_replay.workload import (
    MODES,
    Answer,
    Sizes,
    Workload,
    build,
    common_prefix,
    head_tokens,
    rerender,
)
from tt_serve.tokenizer import Tokenizer

SIZES = Sizes(agents=3, turns=4)


@pytest.fixture(scope="module")
def workload(qwen_tok: Tokenizer) -> Workload:
    return build(SIZES, 0, qwen_tok)


# -- the workload --------------------------------------------------------------------------------


def test_same_seed_same_workload_other_seed_other(qwen_tok: Tokenizer, workload: Workload) -> None:
    assert build(SIZES, 0, qwen_tok) == workload
    other = build(SIZES, 1, qwen_tok)
    assert other.system != workload.system and other.tasks != workload.tasks
    assert other.results != workload.results


def within_10pct(n: int, target: int) -> bool:
    return abs(n - target) <= 0.1 * target


def test_sizes_are_within_10_percent_on_the_demo_tokenizer(
    qwen_tok: Tokenizer, workload: Workload
) -> None:
    assert within_10pct(head_tokens(qwen_tok, workload.system, workload.tools), SIZES.head)
    assert all(within_10pct(len(qwen_tok.encode(t)), SIZES.task) for t in workload.tasks)
    results = [r for per_agent in workload.results for r in per_agent]
    assert len(results) == SIZES.agents * (SIZES.turns - 1)
    assert all(within_10pct(len(qwen_tok.encode(r)), SIZES.tool) for r in results)


def test_agents_share_the_head_and_nothing_after_it(
    qwen_tok: Tokenizer, workload: Workload
) -> None:
    """Every first prompt starts with the same rendered system + tools turn, then differs."""
    head = head_tokens(qwen_tok, workload.system, workload.tools)
    firsts = [workload.conversation(a, "verbatim").prompt_ids(qwen_tok) for a in range(3)]
    assert len(set(map(tuple, firsts))) == 3
    for p in firsts[1:]:
        shared = common_prefix(firsts[0], p)
        assert head <= shared < head + 8  # "Task N:" differs within a few tokens


# An answer as a random-weight model streams it: a leading space, blank lines, runs of spaces.
ANSWER = " Looking at   the  file first.\n\n<think>\nmaybe grep\n</think>\nThe fix:\n\tdone. "


def test_rerender_drops_think_and_normalises_whitespace() -> None:
    assert rerender(ANSWER) == "Looking at the file first. The fix: done."
    assert rerender("a <think>x</think> b") == "a b"
    assert rerender(rerender(ANSWER)) == rerender(ANSWER)


def _turn2_ids(
    qwen_tok: Tokenizer, workload: Workload, mode: str, answer: Answer
) -> tuple[list[int], list[int]]:
    conv = workload.conversation(0, mode)
    first = conv.prompt_ids(qwen_tok)
    conv.add(answer)
    return first, conv.prompt_ids(qwen_tok)


def test_history_is_resent_and_rerendered_answers_differ_in_ids(
    qwen_tok: Tokenizer, workload: Workload
) -> None:
    """Thinking off (the default): turn 1's generation prompt is ``<|im_start|>assistant\n``
    plus an empty think block, which the answer's own message does not re-render; turn 2
    re-sends turn 1's prompt up to the think block, then the answer and the tool result. The
    verbatim answer's ids are the answer text's own; the re-rendered one's differ from its first
    token on."""
    first, verbatim = _turn2_ids(qwen_tok, workload, "verbatim", Answer(content=ANSWER))
    _, rerendered = _turn2_ids(qwen_tok, workload, "rerendered", Answer(content=ANSWER))
    start = C.answer_start(first, qwen_tok.token_to_id(C.IM_START))
    assert start is not None
    assert qwen_tok.decode(first[start:], skip_special_tokens=False) == (
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    body = start + 3  # after <|im_start|> assistant \n
    assert common_prefix(first, verbatim) == body == common_prefix(first, rerendered)
    answer = qwen_tok.encode(ANSWER)
    assert verbatim[body : body + len(answer)] == answer
    assert rerendered[body] != verbatim[body]
    block = f"<tool_response>\n{workload.results[0][0]}\n</tool_response>"
    for ids in (verbatim, rerendered):
        text = qwen_tok.decode(ids[body:], skip_special_tokens=False)
        assert text.count(block) == 1
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_thinking_on_verbatim_extends_the_previous_prompt(qwen_tok: Tokenizer) -> None:
    """Thinking on: the generation prompt opens a think block and the answer is reasoning; the
    verbatim re-send renders it inside that block, so turn 1's whole prompt is a prefix of turn
    2's; re-rendered, the reasoning is dropped and turn 2 departs right after the role."""
    wl = build(SIZES, 0, qwen_tok, thinking=True)
    thought = Answer(reasoning="First read the file, then grep for the caller.")
    first, verbatim = _turn2_ids(qwen_tok, wl, "verbatim", thought)
    _, rerendered = _turn2_ids(qwen_tok, wl, "rerendered", thought)
    assert qwen_tok.decode(first[-5:], skip_special_tokens=False) == (
        "<|im_start|>assistant\n<think>\n"
    )
    assert verbatim[: len(first)] == first
    assert common_prefix(first, rerendered) == len(first) - 2  # before <think>


def test_verbatim_keeps_parsed_parts_rerendered_drops_reasoning() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    a = Answer(content=" x ", reasoning="r", tool_calls=[call])
    assert a.message("verbatim") == {
        "role": "assistant",
        "content": " x ",
        "reasoning_content": "r",
        "tool_calls": [call],
    }
    assert a.message("rerendered") == {"role": "assistant", "content": "x", "tool_calls": [call]}


def test_unknown_mode_is_refused(workload: Workload) -> None:
    with pytest.raises(ValueError):
        workload.conversation(0, "pretty")
    assert MODES == ("verbatim", "rerendered")


def test_answer_start_is_the_previous_prompts_last_im_start() -> None:
    assert C.answer_start([9, 1, 2, 9, 5, 6], 9) == 3
    assert C.answer_start([1, 2, 3], 9) is None and C.answer_start([9, 1], None) is None


# -- the bound and the statistics ----------------------------------------------------------------


def rec(agent: int, turn: int, prompt: int, cached: int, ttft: float = 0.1) -> TurnRecord:
    return TurnRecord(
        agent, turn, prompt, prompt_tokens=prompt, cached_tokens=cached, ttft=ttft, start=0.0
    )


def test_bound_and_added() -> None:
    assert S.bound(400) == pytest.approx(504.0)
    recs = [
        rec(0, 1, 1700, 0),
        rec(0, 2, 2100, 1664),  # added 400, computed 436 <= 504
        rec(0, 3, 2520, 1792),  # added 420, computed 728 > 526
        rec(1, 1, 1710, 1536),
        rec(1, 2, 2110, 2048),  # added 400, computed 62
    ]
    S.fill_added(recs)
    assert [r.added for r in recs] == [None, 400, 420, None, 400]
    assert [r.computed for r in recs] == [1700, 436, 728, 174, 62]
    assert [S.within(r) for r in recs] == [None, True, False, None, True]


def test_a_missing_turn_leaves_the_next_one_unjudged() -> None:
    recs = [rec(0, 1, 100, 0), TurnRecord(0, 2, 0, error="boom"), rec(0, 3, 500, 0)]
    S.fill_added(recs)
    assert recs[2].added is None and S.within(recs[2]) is None


def test_summary_per_turn_and_overall() -> None:
    recs = [
        rec(0, 1, 1700, 0, ttft=0.5),
        rec(1, 1, 1710, 1536, ttft=0.2),
        rec(0, 2, 2100, 1664, ttft=0.1),
        rec(1, 2, 2110, 1792, ttft=0.3),
        rec(0, 3, 2520, 1792, ttft=0.1),
        rec(1, 3, 2530, 2048, ttft=0.1),
    ]
    s = S.summarize(recs, makespan=12.5)
    t2 = s["per_turn"]["2"]
    assert (t2["requests"], t2["failed"]) == (2, 0)
    assert t2["computed_p50"] == pytest.approx((436 + 318) / 2)
    assert t2["computed_max"] == 436
    assert t2["added_p50"] == 400 and t2["bound_p50"] == pytest.approx(504.0)
    assert (t2["within"], t2["judged"], t2["within_frac"]) == (2, 2, 1.0)
    later = s["later_turns"]
    assert (later["within"], later["judged"]) == (3, 4)  # 728 > 1.1 * 420 + 64
    assert later["excess_max"] == pytest.approx(728 - S.bound(420))
    assert s["per_turn"]["1"]["judged"] == 0
    assert s["ttft_p50"] == pytest.approx(0.15)
    assert s["makespan_s"] == 12.5 and s["failed"] == 0 and s["render_mismatches"] == 0
    assert len(s["records"]) == 6 and s["records"][0]["computed"] == 1700
    table = S.markdown({"chunks verbatim": s})
    assert "| chunks verbatim | 2 | 2,105 |" in table
    assert "3/4 (75 %)" in table and "12.5 s" in table


# -- arguments ---------------------------------------------------------------------------------


def test_arguments() -> None:
    a = harness.parse_args(["http"])
    assert a.arms == ["resume-messages", "resume-chunks"]
    assert a.modes == ["verbatim", "rerendered"]
    assert a.sizes == Sizes(8, 6, 1500, 150, 300, 100)
    a = harness.parse_args(["http", "--arms", "default", "--modes", "rerendered", "--turns", "2"])
    assert a.arms == ["default"] and a.modes == ["rerendered"] and a.sizes.turns == 2
    i = harness.parse_args(["inprocess", "--backend", "ttnn-virtual", "--chunk", "2048"])
    assert (i.backend, i.chunk, i.resume_points) == ("ttnn-virtual", 2048, "messages")
    assert i.schedules == ["default"]
    i = harness.parse_args(["inprocess", "--schedules", "default,lockstep"])
    assert i.schedules == ["default", "lockstep"]
    for bad in (
        ["inprocess", "--schedules", "fastest"],
        ["http", "--arms", "llama.cpp"],  # needs --llama-server and --gguf
        ["http", "--arms", "bogus"],
        ["http", "--modes", ""],
        ["inprocess", "--agents", "0"],
        ["inprocess", "--backend", "cuda"],
    ):
        with pytest.raises(SystemExit):
            harness.parse_args(bad)


def test_arms_pass_the_resume_flag_only_when_asked() -> None:
    arms = "resume-messages,resume-chunks,default,responses,messages"
    a = harness.parse_args(["http", "--arms", arms, "--tt-args", "--x 1"])
    sides = {arm: harness.build_side(arm, a, "/m") for arm in a.arms}
    assert sides["resume-messages"].extra == ["--resume-points", "messages", "--x", "1"]
    assert sides["resume-chunks"].extra == ["--resume-points", "chunks", "--x", "1"]
    assert sides["default"].extra == ["--x", "1"] == sides["responses"].extra
    assert harness.request_extras(sides["default"]) == {"return_token_ids": True}
    apis = {arm: harness.arm_api(arm) for arm in a.arms}
    assert apis == {
        "resume-messages": "chat",
        "resume-chunks": "chat",
        "default": "chat",
        "responses": "responses",
        "messages": "messages",
    }


# -- end to end (slow) -------------------------------------------------------------------------

SMALL = Sizes(agents=2, turns=3, head=900, task=40, tool=60, answer=8)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tt_serve.demo import write_demo_model

    return Path(write_demo_model(tmp_path_factory.mktemp("demo") / "m", seed=0, dtype="float32"))


def check_replay(recs: list[TurnRecord], chunk: int) -> None:
    """Every request answered in full, rendered as the client rendered it; every later turn
    hit at least the shared head's whole chunks and, under the chunk rule, computed less than
    what was added plus one chunk (plus the re-rendered generation prompt)."""
    assert len(recs) == SMALL.agents * SMALL.turns and all(r.ok for r in recs)
    S.fill_added(recs)
    for r in recs:
        assert r.prompt_tokens == r.rendered_tokens and r.completion_tokens == SMALL.answer
        if r.turn >= 2:
            assert r.added is not None and r.computed is not None
            assert r.cached_tokens is not None and r.cached_tokens >= chunk
            assert r.computed < r.added + chunk + 5  # + the dropped empty think block
            assert r.resumable is not None and r.answer_start is not None


@pytest.mark.slow
def test_inprocess_replay_on_the_demo_model(demo_dir: Path, qwen_tok: Tokenizer) -> None:
    from bench.agent_replay import inprocess as I

    wl = build(SMALL, 0, qwen_tok)
    shape = I.EngineShape(backend="torch", chunk=128, max_model_len=2048, max_batch=2)
    engine = I.build_engine(str(demo_dir), shape, qwen_tok)
    recs, makespan = I.replay(engine, wl, "rerendered", qwen_tok)
    check_replay(recs, 128)
    assert makespan > 0 and all(r.rerender_changed is not None for r in recs if r.turn >= 2)


@pytest.mark.slow
def test_http_client_against_tt_serve(demo_dir: Path, qwen_tok: Tokenizer) -> None:
    from tests.server.conftest import serve

    wl = build(SMALL, 0, qwen_tok)
    render = C.Rendering(qwen_tok, qwen_tok.token_to_id(C.IM_START))
    extras = {"return_token_ids": True}
    with serve(demo_dir, block_size=64, prefill_chunk=128, max_model_len=2048) as srv:
        asyncio.run(C.warm_up(srv.url, extras))
        recs, makespan = asyncio.run(C.run_replay(srv.url, wl, "verbatim", render, extras))
    check_replay(recs, 128)
    assert all(r.ttft is not None and r.e2el is not None and r.ttft <= r.e2el for r in recs)
    s = S.summarize(recs, makespan)
    assert s["failed"] == 0 and s["render_mismatches"] == 0


@pytest.mark.slow
def test_inprocess_replay_on_the_virtual_device_one_prefill_row_per_step(
    demo_dir: Path, qwen_tok: Tokenizer
) -> None:
    """The ttnn default (one prefill row per step) on the virtual device: every step fits a
    captured trace (a step that did not would fail its requests), no step prefills two
    requests, and every later turn resumes as in lockstep."""
    from bench.agent_replay import inprocess as I

    wl = build(SMALL, 0, qwen_tok)
    shape = I.EngineShape(backend="ttnn-virtual", chunk=128, max_model_len=2048, max_batch=2)
    engine = I.build_engine(str(demo_dir), shape, qwen_tok)
    assert engine.scheduler.max_prefill_rows == 1
    execute = engine.backend.execute
    prefill_rows: list[int] = []

    def counted(batch):  # type: ignore[no-untyped-def]
        prefill_rows.append(sum(r.num_tokens > 1 for r in batch.rows))
        return execute(batch)

    engine.backend.execute = counted  # type: ignore[method-assign]
    recs, _ = I.replay(engine, wl, "verbatim", qwen_tok)
    check_replay(recs, 128)
    assert max(prefill_rows) == 1 and prefill_rows.count(1) > SMALL.agents * SMALL.turns
