"""The scheduler's choices, arms side by side on one engine: mixed against prefill-first steps
(``step_policy``), and how many requests prefill in one step and which first (``prefill_order``).
"""
