"""The prefix cache: its bookkeeping (``micro``), hit equivalence (``prefix_hit_equivalence``),
on vs off in process (``engine_ab``) and over HTTP (``report``, of ``bench/ab/prefix-cache.sh``),
where a hit's TTFT goes (``warm_path``), and restores from the host and disk tiers
(``tier_restore``).
"""
