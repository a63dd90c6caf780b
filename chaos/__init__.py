"""The chaos harness: `python -m chaos --jobs N --seed S` (docs/reliability.md).

N jobs on the fake cloud (its state in a file) with seeded random faults of every kind, a worker
subprocess SIGKILLed at random moments, a Temporal dev server restarted on its database file;
then one reconcile pass, and the promise checked from the cloud's own ledger: one create per VM
identity, nothing left running, no side resource left, no open orphan, every job terminal.

- faults.py: the seeded fault plan and the worker's TOML config.
- processes.py: the dev server and worker subprocesses (start, SIGKILL, restart, always stop).
- postgres.py: the scratch PostgreSQL database of `--database postgresql`.
- workers.py: which worker process ran the jobs' tasks (`--workers N`).
- run.py: the run itself (submit, disrupt, release/cancel, wait, reconcile, collect).
- stalls.py: where jobs lost time, read from their histories.
- partitions.py: what the partitioned nodes did, and the overlap check over the jobs that run.
- report.py: the checks and the summary (text and markdown).
"""
