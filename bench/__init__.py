"""The gpuprov benchmark: `python -m bench` (or `make bench`, `make bench QUICK=1`).

Runs on the fake cloud against a real Temporal dev server that the bench starts itself, with an
in-process worker, and prints (and writes as markdown) what gpuprov adds on top of the cloud:
overhead per job, the ratio to a plain asyncio loop over the same provider calls, throughput,
failover latency, cloud API calls and history size. docs/performance.md explains the method.
"""
