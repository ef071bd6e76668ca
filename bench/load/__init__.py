"""HTTP load against running servers: the load generator (``generator``) and its seeded
workloads (``workloads``), the A/B round of ``bench/ab/*.sh`` and its ledger (``ledger``), the
charts of such a ledger (``plot``), and replicas behind a router (``router``).
"""
