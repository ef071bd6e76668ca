"""``tt-serve check-numerics`` with a ledger line: runs the golden tier's check (in the ttnn
venv: ``PYTHONPATH=. .venv-ttnn/bin/python -m bench.precision.check_numerics --model ...
--layers 4``) and appends its result, with the commit and machine, to ``bench/runs/check-numerics.jsonl``.
Same flags as the command."""

from __future__ import annotations

import sys

from bench.common.provenance import REPO_ROOT, append_ledger

LEDGER = REPO_ROOT / "bench" / "runs" / "check-numerics.jsonl"


def main(argv: list[str] | None = None) -> int:
    from tt_serve.model.tt.golden.check import parser, render, run_check

    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    out = run_check(a)
    print(render(out))
    params = {k: str(v) for k, v in vars(a).items() if k != "json"}
    append_ledger(LEDGER, "check_numerics", params=params, results=out)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
