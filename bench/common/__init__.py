"""What every bench shares and none of them measures: a ledger line's provenance
(``provenance``), side-by-side timing (``timing``), what a pass/fail gate rules out (``gates``)
and a random-weight checkpoint at a published shape (``checkpoint``). Nothing here imports
another package of ``bench``.
"""
