"""The compute of a step, arms side by side in one process: the torch backend's kernels
(``gdn``, ``linear``, ``lm_head_layout``), its whole decode step and model beside others
(``cpu_decode``, ``model_speed``), the sampler (``sampler_speed``, ``sampled_decode``,
``grammar_cost``), and a Tenstorrent mesh's collectives (``tt_ccl``).
"""
