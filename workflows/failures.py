"""How a job's workflow code says the job cannot succeed. Deterministic only."""

from __future__ import annotations


class JobFailed(Exception):
    """Internal: the job cannot succeed; ProvisionJob.run turns it into the workflow's failure
    (after releasing what it holds)."""
