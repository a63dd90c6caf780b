"""`python -m chaos --jobs N --seed S [--kills K] [--server-restarts R] [--workers W]
[--database sqlite|postgresql] [--run-fraction F] [--hostile-fraction F] [--largest L]
[--out FILE]`

Prints progress on stderr and the summary on stdout; exits 0 only when every check passed
(docs/reliability.md says what is checked). `make chaos N=200` runs the large configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from pathlib import Path

from chaos.run import ChaosRun, Options, command_line


def parse(argv: list[str]) -> tuple[Options, Path | None]:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs to submit (default 20)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    parser.add_argument(
        "--kills",
        type=int,
        default=None,
        help="worker SIGKILLs (default: N/20, at least one per worker)",
    )
    parser.add_argument(
        "--server-restarts",
        type=int,
        default=None,
        help="dev server restarts on its database file (default: N/100, at least 1)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=None,
        help="seconds over which jobs arrive and disruptions happen (default: N/2, at least 10)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=600.0,
        help="seconds after the last submission for every job to end (default 600)",
    )
    parser.add_argument(
        "--provisioning-timeout",
        type=int,
        default=120,
        help="each job's provisioning_timeout_seconds (default 120)",
    )
    parser.add_argument(
        "--cancel-fraction", type=float, default=0.1, help="share of jobs cancelled (0.1)"
    )
    parser.add_argument(
        "--density", type=float, default=1.0, help="fault rules per job (default 1.0)"
    )
    parser.add_argument(
        "--run-fraction",
        type=float,
        default=0.25,
        help="share of jobs with `run`, their nodes played by the harness (0.25)",
    )
    parser.add_argument(
        "--hostile-fraction",
        type=float,
        default=0.05,
        help="share of submissions that are hostile raw starts (0.05)",
    )
    parser.add_argument(
        "--mid-step-fraction",
        type=float,
        default=0.05,
        help="share of jobs whose provisioning timeout lands while their creates are in flight "
        "(each create lands after the timeout, whatever the job did meanwhile) (0.05)",
    )
    parser.add_argument(
        "--hedged-fraction",
        type=float,
        default=0.05,
        help="share of leases with placement.hedge whose first attempt never boots (0.05)",
    )
    parser.add_argument(
        "--waiting-fraction",
        type=float,
        default=0.05,
        help="share of leases whose first creates are sold out on every offer, so they wait "
        "for capacity (0.05)",
    )
    parser.add_argument(
        "--largest",
        type=int,
        default=None,
        help="jobs of 256 nodes, the spec's bound (default: 1 from 20 jobs, else 0)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on the task queue, each with its own data dir and killed on its "
        "own (default 1)",
    )
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="the workers' and the API's database: a SQLite file, or a scratch PostgreSQL "
        "database (default sqlite)",
    )
    parser.add_argument(
        "--postgres-url",
        help="with --database postgresql: a server to make the scratch database on (a role that "
        "may CREATE DATABASE); default: the harness runs its own from $GPUPROV_PG_BIN",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("--out", type=Path, help="also write the summary as markdown here")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    kills = args.kills if args.kills is not None else max(args.workers, round(args.jobs / 20))
    restarts = args.server_restarts
    if restarts is None:
        restarts = max(1, round(args.jobs / 100))
    if kills < 0 or restarts < 0:
        parser.error("--kills and --server-restarts cannot be negative")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.postgres_url and args.database != "postgresql":
        parser.error("--postgres-url needs --database postgresql")
    fractions = (
        args.cancel_fraction,
        args.run_fraction,
        args.hostile_fraction,
        args.mid_step_fraction,
        args.hedged_fraction,
        args.waiting_fraction,
    )
    if not all(0 <= fraction <= 1 for fraction in fractions) or sum(fractions) > 1:
        parser.error(
            "the cancel, run, hostile, mid-step, hedged and waiting fractions are shares of the "
            "jobs (0-1 in all)"
        )
    largest = args.largest if args.largest is not None else (1 if args.jobs >= 20 else 0)
    if not 0 <= largest <= args.jobs:
        parser.error("--largest must be between 0 and --jobs")
    options = Options(
        jobs=args.jobs,
        seed=args.seed,
        kills=kills,
        server_restarts=restarts,
        window=args.window if args.window is not None else max(10.0, args.jobs / 2),
        deadline=args.deadline,
        provisioning_timeout=args.provisioning_timeout,
        cancel_fraction=args.cancel_fraction,
        density=args.density,
        keep=args.keep,
        command=command_line(argv),
        workers=args.workers,
        database=args.database,
        postgres_url=args.postgres_url,
        run_fraction=args.run_fraction,
        hostile_fraction=args.hostile_fraction,
        mid_step_fraction=args.mid_step_fraction,
        largest=largest,
        hedged_fraction=args.hedged_fraction,
        waiting_fraction=args.waiting_fraction,
    )
    return options, args.out


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _sender(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _watch_stop_signals(loop: asyncio.AbstractEventLoop, task: asyncio.Task[int]) -> None:
    """SIGINT, SIGTERM, SIGHUP (Ctrl-C, `timeout`, a closed terminal) end the run cleanly, and
    the harness says who sent them: the signals are blocked (before any thread starts) and
    waited for here, so their sender's pid is known."""

    def wait() -> None:
        info = signal.sigwaitinfo(STOP_SIGNALS)
        name = signal.Signals(info.si_signo).name
        print(
            f"chaos: received {name} from pid {info.si_pid} ({_sender(info.si_pid)}); "
            "stopping every process it started",
            file=sys.stderr,
            flush=True,
        )
        loop.call_soon_threadsafe(task.cancel)

    threading.Thread(target=wait, name="chaos-signals", daemon=True).start()


async def _main(options: Options, out: Path | None) -> int:
    run = ChaosRun(options)
    task = asyncio.current_task()
    if task is not None and hasattr(signal, "sigwaitinfo"):
        _watch_stop_signals(asyncio.get_running_loop(), task)  # type: ignore[arg-type]
    try:
        summary = await run.run()
    finally:
        text = run.summary.text()
        print(text, flush=True)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(run.summary.markdown())
    return 0 if summary.passed else 1


def main(argv: list[str] | None = None) -> int:
    options, out = parse(sys.argv[1:] if argv is None else argv)
    if hasattr(signal, "sigwaitinfo"):
        # Blocked in this thread before asyncio starts any: every thread inherits the mask,
        # so only the watcher's sigwaitinfo sees them (children unblock them: processes.py).
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return asyncio.run(_main(options, out))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("chaos: interrupted; every process it started has been stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
