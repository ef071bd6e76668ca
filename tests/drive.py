"""Driving an engine to completion the way the offline API does, for tests of any backend."""

from __future__ import annotations

from tt_serve.engine.engine import Engine
from tt_serve.sequence import RequestOutput, SamplingParams


def run_all(eng: Engine, reqs: list[tuple[list[int], SamplingParams]]) -> list[RequestOutput]:
    """Add every (prompt, params) at once, step until all finish; outputs in request order."""
    for i, (p, sp) in enumerate(reqs):
        eng.add_request(str(i), p, sp)
    done: dict[str, RequestOutput] = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    return [done[str(i)] for i in range(len(reqs))]
