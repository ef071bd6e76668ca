"""The golden tier: tt-metal's own statement of each op's math checks ours.

ttnn ships a golden function for most ops (``ttnn.get_golden_function(ttnn.<op>)``, torch code
in ``ttnn/operations/*.py``). Here every compute op the runtime issues through ``Ops`` runs on
the virtual device and is also computed by its golden, with the same inputs and arguments
(virtual tensors as torch tensors of their logical values), op by op (``tier.GoldenTier``):
``compare`` keeps our math and records the difference; ``golden`` writes the golden's result,
so a model runs with golden math, trace replays included. ``calls.py`` maps each op onto its
golden and states every convention the two sides spell differently; ops with no golden in
0.81.1 are listed as such. ``formats.py`` checks that block-float tensors hold values their
format can represent, with ttnn's own packing as the oracle; ``e2e.py`` runs the runtime's
decode and chunked prefill with golden math against the torch reference backend; ``check.py``
is ``tt-serve check-numerics``.

Only the ttnn venv (Python 3.12, ttnn 0.81.1 and torch) can import ttnn, so this package runs
there alone and imports ttnn lazily. The main venv (Python 3.11) has no ttnn: the virtual
device keeps its own torch math, which the tests here hold to the goldens. Where ttnn ships a
golden we compute with it when we can (this tier's ``golden`` mode) rather than trust our copy.
Like the mock tier (``plan/mock.py``) this is a check: no runtime, launch or serving code
imports it (``tests/unit/test_import_boundaries.py``).
"""
