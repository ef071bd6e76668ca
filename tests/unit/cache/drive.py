"""Requests through a PrefixCache as the scheduler drives them, for the cache's tests."""

from __future__ import annotations

from tt_serve.cache import PrefixCache, ResumePoints


def serve(cache: PrefixCache, rid: str, toks: list[int], pts: ResumePoints) -> int:
    """Admit, prefill chunk by chunk (publishing every save), release; the hit length."""
    res = cache.admit(rid, toks, 1, pts)
    cache.restore_done(rid)
    done = res.cached_tokens
    while done < len(toks):
        done = pts.next_end(done)
        save = cache.on_computed(rid, toks, done, snapshot_ok=True)
        if save is not None:
            cache.publish(save)
    cache.release(rid)
    cache.check_invariants()
    return res.cached_tokens
