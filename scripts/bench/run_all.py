"""Run every benchmark of issue 7 one after the other, then write docs/benchmarks.md and the plot.

Called by ``scripts/bench/all`` (see its --help). Each benchmark is a script of its own under
scripts/bench/ that prints one JSON object; this runner starts them in turn (never two at once:
they would compete for the same cores), keeps their JSON in a results file after each one (a
failure leaves the others' figures), and hands the results to scripts/bench/report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

ORDER = ("send_path", "api_calls", "faults", "receiver", "latency", "overload", "latency_80", "end_to_end", "db_cost",
         "memory", "relay", "consumer", "intake_batch", "send_path_other_broker", "consumer_other_broker", "tracking_calls")


def plan(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, list[str]]:
    """The command line of each benchmark. Latency's rate comes from send_path's result; the
    overload run offers twice that, and what the worker sustained there, with intake beside it,
    is the capacity latency_80 offers 80 % of."""
    quick = args.quick
    send_rate = (results.get("send_path", {}).get("result") or {}).get("sends_per_s") or args.fallback_rate
    sustained = ((results.get("overload", {}).get("result") or {}).get("ours") or {}).get("sustained_per_s") \
        or send_rate * 0.6  # without the overload run: figure 1's rate less intake's share (about 0.6 here)
    other_broker = "rabbitmq" if args.broker == "redis" else "redis"
    return {
        "send_path": ["send_path.py", "--notifications", "500" if quick else "1000", "--concurrency", "2",
                      "--broker", args.broker],
        "api_calls": ["api_calls.py", "--contacts", "30" if quick else "100"],
        "faults": ["faults.py", "--events", "300" if quick else "1000", "--contacts", "60" if quick else "200"],
        "receiver": ["receiver.py", "--requests", "3000" if quick else "10000", "--store", "postgres", "--rounds", "1" if quick else "3"],
        "latency": ["latency.py", "--rate", f"{send_rate / 2:.1f}", "--capacity", f"{send_rate:.1f}",
                    "--seconds", "20" if quick else "60"],
        "overload": ["latency.py", "--rate", f"{send_rate * 2:.1f}", "--capacity", f"{send_rate:.1f}",
                     "--seconds", "10" if quick else "20", "--wait", "600"],
        "latency_80": ["latency.py", "--rate", f"{sustained * 0.8:.1f}", "--capacity", f"{sustained:.1f}",
                       "--seconds", "20" if quick else "60"],
        "end_to_end": ["end_to_end.py", "--notifications", "600" if quick else "1200", "--rate", "30"],
        "db_cost": ["db_cost.py", "--sizes", "10000", "1000000", "--sends", "300" if quick else "1000",
                    "--profile", "100" if quick else "300"],
        "memory": ["memory.py", "--sends", str(args.memory_sends or (10_000 if quick else 100_000))]
                  + (["--in-process"] if args.memory_in_process else []),
        "relay": ["relay.py", "--rows", "3000" if quick else "10000"],
        "consumer": ["consumer.py", "--outcomes", "500" if quick else "1000", "--concurrency", "2",
                     "--broker", args.broker],
        "intake_batch": ["intake_batch.py", "--single", "300" if quick else "1000", "--events", "3000" if quick else "10000"],
        "send_path_other_broker": ["send_path.py", "--notifications", "500" if quick else "1000", "--concurrency", "2",
                               "--broker", other_broker],
        "consumer_other_broker": ["consumer.py", "--outcomes", "500" if quick else "1000", "--concurrency", "2",
                              "--broker", other_broker],
        # the product as deployed (no lifted limits, no fast timers): each phase waits out the read-backs
        "tracking_calls": ["tracking_calls.py", "--notifications", "30" if quick else "100"],
    }


def _monitor_for(name: str) -> Any:
    """A CPU monitor for the benchmarks whose script records no CPU profile of its own."""
    if name != "receiver":
        import contextlib

        return contextlib.nullcontext()
    from cpu_monitor import CpuMonitor

    return CpuMonitor({
        "bare endpoint (uvicorn)": lambda _name, command: "uvicorn" in command and "receiver:bare_app" in command,
        "receiver (uvicorn)": lambda _name, command: "uvicorn" in command and "app_from_environment" in command,
        "load generator": lambda _name, command: "spawn_main" in command,
    })


def run_one(name: str, argv: list[str], log_dir: Path) -> dict[str, Any]:
    command = [sys.executable, str(HERE / argv[0]), *argv[1:]]
    shown = " ".join([".venv/bin/python", f"scripts/bench/{argv[0]}", *map(shlex.quote, argv[1:])])
    print(f"\n== {name}: {shown}", flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    load_before = os.getloadavg()
    started = time.time()
    stderr_path = log_dir / f"{name}.stderr.log"
    monitor = _monitor_for(name)
    with stderr_path.open("wb") as stderr, monitor:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr)
        if hasattr(monitor, "root_pid"):
            monitor.root_pid = process.pid  # only the benchmark's own processes are counted
        process.stdout_bytes, _ = process.communicate()  # type: ignore[attr-defined]
    seconds = time.time() - started
    output = process.stdout_bytes.decode(errors="replace")  # type: ignore[attr-defined]
    result = None
    start = output.find("{")
    if start >= 0:
        try:
            result = json.loads(output[start:])
        except json.JSONDecodeError:
            result = None
    # "incomplete": the script printed its figures but says the run was not whole (exit code 1)
    status = "failed" if result is None else "ok" if process.returncode == 0 else "incomplete"
    print(f"   {status} in {seconds:.0f} s (exit {process.returncode}); stderr: {stderr_path}", flush=True)
    if result is None:
        tail = stderr_path.read_text(errors="replace")[-3000:]
        print(tail, file=sys.stderr)
    if result is not None and hasattr(monitor, "report"):
        result["cpu_profile"] = monitor.report()
    return {"command": shown, "exit_code": process.returncode, "status": status, "seconds": round(seconds, 1),
            "started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "result": result, "stdout_tail": None if result is not None else output[-2000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/all",
        description="Run every benchmark (issue 7) and write docs/benchmarks.md and docs/benchmarks.png. "
                    "Needs PostgreSQL at 127.0.0.1:5432 and redis-server installed (each benchmark runs its own), "
                    "and matplotlib for the plot (pip install 'matplotlib>=3.8').")
    parser.add_argument("--quick", action="store_true", help="smaller numbers everywhere (about 20 minutes)")
    parser.add_argument("--only", nargs="+", choices=ORDER, help="run these benchmarks only (the others' figures are left out)")
    parser.add_argument("--memory-sends", type=int, help="sends for the memory figure (default 100000; 10000 with --quick)")
    parser.add_argument("--memory-in-process", action="store_true", help="measure memory around an in-process send loop")
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis",
                        help="the broker of the send-path and consumer figures (rabbitmq: a vhost of the run's own);"
                             " send_path_other_broker and consumer_other_broker run them again on the other one")
    parser.add_argument("--fallback-rate", type=float, default=130.0, help="warm sends/s for latency when send_path is not run")
    parser.add_argument("--merge", type=Path, metavar="RESULTS_JSON",
                        help="start from an earlier results file: the benchmarks run now replace their figures in it"
                             " (with --only: rerun one figure, keep the others; each keeps its own date in the docs)")
    parser.add_argument("--results", type=Path, help="where to keep the JSON results (default: /tmp/notification-dispatcher-bench/)")
    parser.add_argument("--report-only", type=Path, metavar="RESULTS_JSON", help="rewrite the docs from a results file; run nothing")
    parser.add_argument("--markdown", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "benchmarks.png")
    args = parser.parse_args(argv)

    import report  # fails early, with the install line, when matplotlib is missing

    report.require_matplotlib()
    if args.report_only:
        results = json.loads(args.report_only.read_text())
        report.write(results, markdown=args.markdown, plot=args.plot)
        print(f"wrote {args.markdown} and {args.plot} from {args.report_only}")
        return 0

    from common import machine

    out_dir = Path("/tmp/notification-dispatcher-bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results_path = args.results or out_dir / f"results-{stamp}.json"
    log_dir = out_dir / f"logs-{stamp}"
    log_dir.mkdir(parents=True, exist_ok=True)
    invoked = "scripts/bench/all" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    results: dict[str, Any] = {"command": invoked, "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                               "machine": machine(), "quick": args.quick, "benchmarks": {}}
    if args.merge:
        earlier = json.loads(args.merge.read_text())
        results["benchmarks"] = earlier["benchmarks"]
        results["merged_from"] = {"file": str(args.merge), "command": earlier.get("command"),
                                  "started_at": earlier.get("started_at"), "finished_at": earlier.get("finished_at"),
                                  "seconds": earlier.get("seconds")}
    began = time.time()
    for name in ORDER:
        if args.only and name not in args.only:
            continue
        argv_of = plan(args, results["benchmarks"])[name]
        results["benchmarks"][name] = run_one(name, argv_of, log_dir)
        results["seconds"] = round(time.time() - began, 1)
        results_path.write_text(json.dumps(results, indent=2))
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results_path.write_text(json.dumps(results, indent=2))
    report.write(results, markdown=args.markdown, plot=args.plot)
    failed = [name for name, run in results["benchmarks"].items() if run["status"] != "ok"]
    print(f"\nresults: {results_path}\nwrote {args.markdown} and {args.plot} in {time.time() - began:.0f} s")
    if failed:
        print(f"benchmarks that failed or reported an incomplete run: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
