"""Command line: ``tt-serve serve | generate | demo-model | check-config | plan | doctor``."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tt_serve.model.spec import ModelSpec
    from tt_serve.model.tt.boards import DeviceSpec
    from tt_serve.model.tt.options import TTOptions


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc


def _generate(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="tt-serve generate", description="Offline generation.")
    p.add_argument("--model", required=True, help="checkpoint folder (HF layout)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-ids", type=_int_list, help="comma-separated prompt token ids")
    src.add_argument("--prompt", help="prompt text (needs the model's tokenizer)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--logprobs", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--backend", choices=("torch", "ttnn"), default="torch")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--json", action="store_true", help="print the output as JSON")
    a = p.parse_args(argv)

    from tt_serve.llm import LLM
    from tt_serve.sequence import RequestError, SamplingParams

    params = SamplingParams(
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        seed=a.seed,
        logprobs=a.logprobs,
        ignore_eos=a.ignore_eos,
    )
    try:
        llm = LLM(
            a.model,
            backend=a.backend,
            device=a.device,
            dtype=a.dtype,
            prefix_caching=not a.no_prefix_caching,
        )
        prompt = a.prompt if a.prompt is not None else a.prompt_ids
        (out,) = llm.generate([prompt], params)
    except (RequestError, FileNotFoundError, ValueError) as exc:
        print(f"tt-serve generate: error: {exc}", file=sys.stderr)
        return 2
    result = {
        "token_ids": out.token_ids,
        "text": out.text,
        "finish_reason": out.finish_reason,
        "cached_tokens": out.cached_tokens,
        "logprobs": (
            [{str(k): v for k, v in d.items()} for d in out.logprobs]
            if out.logprobs is not None
            else None
        ),
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    return 0


def _demo_model(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tt-serve demo-model",
        description="Write a tiny random-weight Qwen3.5 checkpoint with the real Qwen tokenizer.",
    )
    p.add_argument("dir", help="output folder")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from tt_serve.demo import write_demo_model

    path = write_demo_model(a.dir, seed=a.seed)
    print(f"wrote demo model (random weights) to {path}")
    return 0


def _check_config(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tt-serve check-config",
        description="Check a deployment config (the NixOS module's option names) for violations.",
    )
    p.add_argument("file", help="JSON file")
    a = p.parse_args(argv)
    from tt_serve.config.nix_json import check_config_main

    return check_config_main(a.file)


def _plan_spec(model: str) -> ModelSpec:
    """A checkpoint folder's spec, or a published size's when ``model`` names one and is no
    folder (plan before downloading anything)."""
    from tt_serve.model.published import SIZES, published_config
    from tt_serve.model.spec import ModelSpec

    if not Path(model).is_dir() and model.strip().lower() in SIZES:
        return ModelSpec.from_config(published_config(model), model_id=model.strip().lower())
    return ModelSpec.from_hf_dir(model)


def _plan_config(model: str) -> dict[str, Any]:
    """The config.json ``_plan_spec`` read, for the mock run's child."""
    from tt_serve.model.published import SIZES, published_config

    if not Path(model).is_dir() and model.strip().lower() in SIZES:
        return dict(published_config(model))
    return dict(json.loads((Path(model) / "config.json").read_text()))


def _plan_smallest(spec: ModelSpec, req: TTOptions, candidates: list[str]) -> int:
    """The first device of ``candidates`` whose plan fits: one verdict line per device tried,
    then that device's whole plan (exit 3 when none fits)."""
    from tt_serve.model.tt.plan import planner, report

    for name in candidates:
        p = planner.plan(spec, planner.device_spec(name), req)
        if not p.ok:
            print(f"{name}: does not fit: [{p.limit_rule}] {p.limit_message}")
            continue
        print(f"{name}: fits; the smallest of {', '.join(candidates)} that does")
        for line in report.format_plan(p, req):
            print(line)
        return 0
    print(f"none of {', '.join(candidates)} fits")
    return 3


def _plan_mesh(text: str, dev: DeviceSpec) -> tuple[int, int]:
    """``--mesh ROWSxCOLS`` for ``dev``: one of the shapes tt-metal opens it as."""
    from tt_serve.config.serve_config import parse_mesh

    mesh = parse_mesh(text)
    if mesh is None:
        raise ValueError(f'--mesh must be "ROWSxCOLS", e.g. "2x4" (got "{text}")')
    if mesh not in dev.meshes:
        shapes = ", ".join(f"{r}x{c}" for r, c in dev.meshes)
        raise ValueError(f"{dev.name} opens as {shapes}, not {text}")
    return mesh


def _plan_torch(model: str, as_json: bool) -> int:
    """What a batch-1 decode step of the torch CPU backend reads of its weights, per profile."""
    from tt_serve.model.precision import PROFILES
    from tt_serve.model.torch.footprint import decode_read

    try:
        spec = _plan_spec(model)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"tt-serve plan: error: {exc}", file=sys.stderr)
        return 2
    reads = {p or "float32": decode_read(spec, p) for p in (None, *PROFILES)}
    if as_json:
        rows = {
            n: {"projections": r.projections, "lm_head": r.lm_head, "total": r.total}
            for n, r in reads.items()
        }
        print(json.dumps({"backend": "torch", "model": spec.model_id, "decode_read_bytes": rows}))
        return 0
    print(f"torch CPU backend, {spec.model_id}: weight bytes one batch-1 decode step reads")
    print(f"{'profile':10} {'projections':>12} {'lm head':>9} {'total':>9}")
    for name, r in reads.items():
        gb = [f"{v / 1e9:.2f} GB" for v in (r.projections, r.lm_head, r.total)]
        print(f"{name:10} {gb[0]:>12} {gb[1]:>9} {gb[2]:>9}")
    print(
        "A batch-1 decode step is bound by these bytes over the memory's read bandwidth "
        "(python -m bench.kernels.block_float measures both); float32's head is its int8 screen."
    )
    return 0


def _plan(argv: Sequence[str]) -> int:
    from tt_serve.config.serve_config import DEFAULT_BATCH, PRECISIONS, ServeConfig
    from tt_serve.model.published import SIZES
    from tt_serve.model.tt.plan.tiers import TARGETS, AgentShape

    d = ServeConfig()
    p = argparse.ArgumentParser(
        prog="tt-serve plan",
        description=(
            "Plan a ttnn deployment without a device or weights: run the backend's startup "
            "(weights, pools, traces) and a short workload on a shape-only model of the chip, "
            "and print the memory plan, or the limit that stops it (exit status 3)."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        help="checkpoint folder (config.json is enough) or a published size: " + ", ".join(SIZES),
    )
    p.add_argument(
        "--backend",
        choices=("ttnn", "torch"),
        default="ttnn",
        help="torch: the CPU backend's weight bytes per decode token in every profile",
    )
    p.add_argument("--device", default="p150", help="n150, n300, p150, p300, t3k, ...")
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_BATCH["ttnn"])
    p.add_argument("--prefill-chunk", type=int, default=d.prefill_chunk)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--snapshot-slots", type=int, default=d.snapshot_slots)
    p.add_argument("--precision", choices=PRECISIONS, default=d.precision)
    p.add_argument("--kv-blocks", type=int, default=d.kv_blocks, help="0: size from DRAM")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument(
        "--trace-region-size",
        type=int,
        default=d.trace_region_size,
        help="bytes; 0 sizes it from the captured traces",
    )
    p.add_argument(
        "--traced-prefill",
        action=argparse.BooleanOptionalAction,
        default=ServeConfig(backend="ttnn").resolved_traced_prefill,
    )
    p.add_argument("--search-max-batch", action="store_true", help="bisect the largest max_batch")
    p.add_argument(
        "--compare-precisions",
        action="store_true",
        help="plan every precision profile and print each one's capacity (weights read per "
        "decode step, KV blocks) beside its measured output-quality cost",
    )
    p.add_argument(
        "--smallest",
        default=None,
        metavar="DEV,DEV,...",
        help="plan on each device of the list in order (smallest first, e.g. "
        "p150,p300,p150x4,p150x8) and print the plan of the first that fits (overrides --device)",
    )
    p.add_argument(
        "--mesh",
        default="",
        metavar="ROWSxCOLS",
        help="the mesh to open the device as (default: its own, e.g. 1x8 on t3k, 8x4 on "
        "galaxy); one tt-metal opens it as too, e.g. 2x4 on t3k",
    )
    p.add_argument(
        "--agents",
        default=",".join(f"{s.agents}x{s.context // 1024}k" for s in TARGETS),
        metavar="NxCTX,...",
        help="agent shapes whose conversations the plan places in the device pool and the "
        "host and disk tiers (e.g. 8x128k,4x256k)",
    )
    p.add_argument(
        "--host-cache-gb",
        type=float,
        default=0.0,
        help="GiB of host-memory tier for the --agents lines (as serve's flag)",
    )
    p.add_argument(
        "--disk-cache-gb",
        type=float,
        default=0.0,
        help="GiB of disk tier for the --agents lines (as serve's flag)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--ops", default=None, help="write every ttnn call as JSON lines to FILE")
    p.add_argument(
        "--checker",
        choices=("virtual", "mock", "both"),
        default=None,
        help="who says it fits: the virtual device (our model of tt-metal), tt-metal itself on "
        "a mock box of the device (a Python that imports ttnn 0.81.1 runs it: this one, "
        "TT_SERVE_TTNN_PYTHON, or the .venv-ttnn scripts/setup-ttnn-venv builds), or both "
        "(the default where such a Python exists; else virtual)",
    )
    a = p.parse_args(argv)
    if a.backend == "torch":
        return _plan_torch(a.model, a.json)

    from tt_serve.model.tt.options import TTOptions
    from tt_serve.model.tt.plan import planner, report

    try:
        spec = _plan_spec(a.model)
        req = TTOptions(
            precision="bfloat16" if a.precision == "auto" else a.precision,
            max_batch_size=a.max_batch_size or DEFAULT_BATCH["ttnn"],
            prefill_chunk=a.prefill_chunk,
            block_size=a.block_size,
            snapshot_slots=a.snapshot_slots,
            kv_blocks=a.kv_blocks,
            max_model_len=a.max_model_len,
            trace_region_size=a.trace_region_size,
            traced_prefill=a.traced_prefill,
        )
        agents = [AgentShape.parse(t) for t in a.agents.split(",") if t.strip()]
        if a.host_cache_gb < 0 or a.disk_cache_gb < 0:
            raise ValueError("--host-cache-gb and --disk-cache-gb must be >= 0")
        candidates = a.smallest.split(",") if a.smallest else [a.device]
        for name in candidates:
            planner.device_spec(name)
        board = planner.device_spec(a.device)
        if a.mesh:
            req = req.replace(mesh=_plan_mesh(a.mesh, board))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"tt-serve plan: error: {exc}", file=sys.stderr)
        return 2
    from tt_serve.model.tt.plan import mock

    checker = a.checker or ("both" if mock.ttnn_python() else "virtual")
    if checker != "virtual" and not mock.ttnn_python():
        print(
            f"tt-serve plan: error: --checker {checker} needs a Python that imports ttnn "
            f"{mock.TTNN_VERSION}: this one, TT_SERVE_TTNN_PYTHON, or .venv-ttnn beside the "
            "source (scripts/setup-ttnn-venv builds it)",
            file=sys.stderr,
        )
        return 2
    from tt_serve.model.tt.plan import cost_table

    costs = cost_table.nearest(cost_table.load_table(), a.model, spec.hidden_size)
    if a.compare_precisions:
        return report.compare_precisions(spec, board, req, costs, print)
    if a.smallest:
        return _plan_smallest(spec, req, candidates)
    return report.main(
        spec,
        board,
        req,
        as_json=a.json,
        ops_file=a.ops,
        search_batch=a.search_max_batch,
        echo=print,
        checker=checker,
        config=_plan_config(a.model) if checker != "virtual" else None,
        costs=costs,
        agents=agents,
        host_gb=a.host_cache_gb,
        disk_gb=a.disk_cache_gb,
    )


def _doctor(argv: Sequence[str]) -> int:
    from tt_serve.doctor import main as doctor_main

    return doctor_main(argv)


def _check_numerics(argv: Sequence[str]) -> int:
    import importlib.util

    if importlib.util.find_spec("tt_serve.model.tt.golden") is None:
        print(
            "tt-serve check-numerics: error: the golden tier is a development check and is not "
            "part of a deployed package; run it from a source checkout's ttnn venv "
            "(scripts/setup-ttnn-venv)",
            file=sys.stderr,
        )
        return 2
    from tt_serve.model.tt.golden import check

    check.parser().parse_args(list(argv))  # --help and bad flags are answered in either venv
    if importlib.util.find_spec("ttnn") is None:
        print(
            "tt-serve check-numerics: error: needs the ttnn venv (Python 3.12 with ttnn 0.81.1 "
            "and torch), whose golden functions it runs; build it with scripts/setup-ttnn-venv, "
            "then run: PYTHONPATH=. .venv-ttnn/bin/python -m tt_serve.cli check-numerics "
            + " ".join(argv),
            file=sys.stderr,
        )
        return 2
    return check.main(argv)


def _serve(argv: Sequence[str]) -> int:
    from tt_serve.server.run import serve_main

    return serve_main(argv)


COMMANDS = {
    "serve": (_serve, "run the OpenAI-compatible HTTP server"),
    "generate": (_generate, "generate offline from token ids or text"),
    "demo-model": (_demo_model, "write the tiny random-weight demo model"),
    "check-config": (_check_config, "validate a deployment config file"),
    "plan": (_plan, "plan a ttnn deployment (memory, traces, limits) without a device"),
    "check-numerics": (_check_numerics, "run a model with ttnn's golden math (ttnn venv)"),
    "doctor": (_doctor, "check this host can serve (devices, driver, SFPI, huge pages, cache)"),
}


@contextlib.contextmanager
def json_stdout(*, to_exit: bool) -> Iterator[None]:
    """Only what the command prints (its JSON) reaches stdout: while it runs, file descriptor 1
    points at stderr, so log lines written there by C++ libraries (tt-metal's, when ttnn opens
    its mock devices) or by anything else land on stderr, and ``sys.stdout`` is a buffer
    written to the real stdout at the end. ``to_exit``: the process ends after the command, so
    descriptor 1 stays on stderr (tt-metal logs again from its destructors at exit); else it is
    restored (a caller in the same process)."""
    sys.stdout.flush()
    saved = os.dup(1)
    buffer = io.StringIO()
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        if not to_exit:
            os.dup2(saved, 1)
        data = memoryview(buffer.getvalue().encode())
        try:
            while data:
                data = data[os.write(saved, data) :]
        except BrokenPipeError:  # `--json | head`: the reader left; the exit status tells
            if not to_exit:  # Python's own flush of stdout at exit must not fail either
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.close(null)
        os.close(saved)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: tt-serve {" + ",".join(COMMANDS) + "} [options]\n")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:16s}{help_text}")
        return 0 if args else 2
    cmd = COMMANDS.get(args[0])
    if cmd is None:
        print(f"tt-serve: unknown command {args[0]!r}; see 'tt-serve --help'", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if "--json" in args[1:]:
            with json_stdout(to_exit=argv is None):
                return cmd[0](args[1:])
        return cmd[0](args[1:])
    except KeyboardInterrupt:  # Ctrl-C during imports or setup: a message, not a traceback
        print(f"tt-serve {args[0]}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
