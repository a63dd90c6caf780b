"""A job's team, as activities: admitted at the start (part of `job_context`), and its spend read
while the job holds machines (gpuprov/store/teams.py).

Admission refuses a job, naming why, when its team does not exist, when its `env` refers to a
secret the team cannot see, or when its GPUs would take the team past its limit on GPUs held at
once; otherwise it records the run as the team's and answers what is left of the team's monthly
budget, which the workflow holds every offer's estimate against (workflows/budget.py). Nothing
here reads a secret's value: only whether the name exists.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from pydantic import Field
from temporalio import activity

from gpuprov.models import TeamSpend
from gpuprov.store.secrets import Vault, unknown_secret
from gpuprov.store.teams import Teams
from providers.base import Model


class AdmitInput(Model):
    team: str
    job: str
    run: str
    nodes: int
    gpus_per_node: int
    now: datetime  # the job's clock: the month whose spend counts
    # The secrets each `env` entry refers to, by variable name.
    secrets: dict[str, list[str]] = Field(default_factory=dict)


class Admission(Model):
    team: str
    refused: str | None = None  # why the job may not go on, naming the field or the limit
    monthly_budget_usd: float | None = None
    left_usd: float | None = None  # what is left of the month's budget at admission
    spent_usd: float = 0.0
    on_exceed: str = "release"
    check_seconds: float = 300.0  # how often a job holding machines reads the team's spend


class SpendInput(Model):
    team: str
    now: datetime


class TeamActivities:
    def __init__(self, teams: Teams, vault: Vault, check_seconds: float = 300.0) -> None:
        self._teams = teams
        self._vault = vault  # names only: it holds no key
        self._check_seconds = check_seconds

    def all(self) -> list[object]:
        return [self.team_spend]

    def admit(self, request: AdmitInput) -> Admission:
        """Blocking (run from a thread): the admission of one run."""
        team = self._teams.get(request.team)
        if team is None:
            return Admission(
                team=request.team,
                refused=f"team: no team named {request.team!r} (an admin creates it: "
                f"gpuprov team create {request.team})",
            )
        for variable, names in request.secrets.items():
            missing = self._vault.missing(request.team, names)
            if missing:
                return Admission(
                    team=request.team,
                    refused=unknown_secret(variable, missing[0], request.team),
                )
        if team.monthly_budget_usd is None and team.max_gpus is None:
            # nothing to weigh the job against: the month's spend (a read of every cost and
            # every machine the team holds) would change no answer
            self._teams.admit_run(request.job, request.run, request.team, request.gpus_per_node)
            return Admission(
                team=request.team, on_exceed=team.on_exceed, check_seconds=self._check_seconds
            )
        spend = self._teams.spend(request.team, request.now)
        wanted = request.nodes * request.gpus_per_node
        free = spend.gpus_free
        if free is not None and wanted > free:
            return Admission(
                team=request.team,
                refused=f"refused: team {request.team!r} may hold {spend.max_gpus} GPU(s) at "
                f"once; it holds {spend.gpus_held} now, so {max(free, 0)} are left, and this "
                f"job needs {wanted} ({request.nodes} node(s) x {request.gpus_per_node})",
            )
        self._teams.admit_run(request.job, request.run, request.team, request.gpus_per_node)
        return Admission(
            team=request.team,
            monthly_budget_usd=spend.monthly_budget_usd,
            left_usd=spend.left_usd,
            spent_usd=spend.spent_usd,
            on_exceed=spend.on_exceed,
            check_seconds=self._check_seconds,
        )

    @activity.defn(name="team_spend")
    async def team_spend(self, request: SpendInput) -> TeamSpend:
        """The team's month so far: what a running job under a budget checks now and then."""
        return await asyncio.to_thread(self._teams.spend, request.team, request.now)
