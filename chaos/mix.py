"""Which job is which, drawn from the seed: leases, jobs that run (and how their nodes end),
hostile raw starts, the largest job, and the point at which each cancelled job is cancelled.

- A **lease** (no `run`) is released as soon as it is ready.
- A job that **runs** has `run`, `recovery.max_restarts` 0 or 1 and a 2 s health-check interval;
  the harness plays its nodes (chaos/nodes.py) and ends the work as its `Work` says: every node
  exits 0, one node exits with a chosen non-zero code, one node is killed mid-run (its
  machine preempted in the cloud's ledger, and it never reports again), or one node is
  **partitioned** mid-run: its machine was created with the fake cloud's `partitioned` effect,
  and its agent is cut off from the API (`FakeCloudState.cut_off`) while its machine runs on,
  so the liveness sweep finds it lost. Of the partitions, dealt in turn: `fenced` has a
  restart left and its machine's delete fails (the teardown records a leak, so the new
  attempt's work must wait out the cut-off node's lease), `gone` has a restart left and its
  delete succeeds (the machine confirmed gone, nothing to wait for), `last` has no restart
  left and its delete fails. The first epoch runs until it is given up; the next one exits 0.
- A **hostile** start is a raw `ProvisionJob` start with input no job may accept
  (chaos/hostile.py); the first one of a run is an impostor named like a real job of the run.
- A **mid-step** job is a lease whose provisioning timeout (5 s) lands while the creates of
  its first attempt are in flight: each of them takes 10 s and is carried out by the cloud
  whatever the job did meanwhile (the fake cloud's `lands_late`), so the job unwinds with a
  machine on its way. It must end failed by its timeout and leave nothing, on any machine.
- A **hedged** job is a lease with `placement.hedge` (2 attempts, the second after
  HEDGE_AFTER_SECONDS) whose first attempt's machines never boot (the fake cloud's
  `boot_hang`): the second offer's attempt races it and should win, the first be torn down
  through its own compensation, whatever disruption lands meanwhile.
- A **waiting** job is a lease whose first creates are sold out on every offer (a Capacity
  error, STOCKOUT_ROUNDS times the job's nodes): it waits for capacity (the default
  `placement.capacity_wait`) on its durable timer, and its stockouts back off the offerings
  for every other job too, as a region that sold out would.
- The **largest** job asks for the spec's bound of nodes (256), with a provisioning timeout
  of 900 s.
- A **cancelled** job is cancelled when its status first shows its cancel point
  (chaos/cancels.py): cancels are dealt over every point in shuffled rounds, so a run with
  eight of them cancels once in each state.

The first job that runs has a node killed with a restart left, the next ones a non-zero exit,
a kill without a restart left, exits 0 and a partition (then shuffled rounds); the first
hostile start is the impostor.

The draws come from a generator of their own: a seed's sizes, arrival times and disruptions
do not depend on the mix, and its fault rules only in that none is aimed at a hostile start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from chaos.cancels import POINTS
from chaos.hostile import CASES, IMPOSTOR
from gpuprov.config import FaultRule
from providers.errors import ErrorKind

LARGEST_NODES = 256  # JobSpec.nodes' bound
# Its machines are torn down one after another (a failed attempt's, and at release): minutes for
# 256 nodes on a loaded machine, so a first attempt that fails would use up the usual timeout.
LARGEST_PROVISIONING_TIMEOUT = 900
RUN_HEALTH_INTERVAL = 2  # seconds: a killed node is found by the job's next health check
EXIT_CODES = (1, 2, 3, 7, 42, 137)
MID_STEP_TIMEOUT = 5  # seconds: shorter than the creates below take
MID_STEP_CREATE_SECONDS = 10.0
# A partitioned node is cut off this long after it registered even if its work never came.
PARTITION_BACKSTOP = 30.0
HEDGE_AFTER_SECONDS = 1.0  # the hedge starts this long after the hung first attempt
# A waiting job's creates are sold out this many times per node: past the three offers, so it
# has to wait for a block to lapse at least once.
STOCKOUT_ROUNDS = 4
# Hedged and waiting jobs are there to race and to wait under disruptions, not to meet the
# harness's usual deadline: on a busy machine 120 s ends them before either happens.
RACE_AND_WAIT_PROVISIONING_TIMEOUT = 600

Ending = Literal["exit", "kill", "until_stopped", "partition"]
Partition = Literal["fenced", "gone", "last"]
PARTITIONS: tuple[Partition, ...] = ("fenced", "gone", "last")


@dataclass(frozen=True)
class Work:
    """What a job's nodes do with their work (chaos/nodes.py plays it)."""

    ending: Ending
    rank: int = 0  # the node whose exit or kill decides the run
    code: int = 0  # its exit code (0: every node exits 0)
    after: float = 2.0  # seconds the work runs before that happens (partition: the next epoch)
    max_restarts: int = 0
    partition: Partition | None = None  # for ending partition
    cut_after: float = 0.0  # partition: seconds the node runs its work before it is cut off

    @property
    def delete_fails(self) -> bool:
        """The partitioned node's machine outlives its teardown (a leak the reconciler ends)."""
        return self.partition in ("fenced", "last")

    def describe(self) -> str:
        restarts = f"max_restarts {self.max_restarts}"
        if self.ending == "partition":
            delete = "its delete fails" if self.delete_fails else "its delete succeeds"
            return (
                f"node {self.rank} partitioned after {self.cut_after:g}s, {delete} "
                f"({self.partition}, {restarts})"
            )
        if self.ending == "until_stopped":
            return f"runs until stopped ({restarts})"
        if self.ending == "kill":
            return f"node {self.rank} killed after {self.after:g}s ({restarts})"
        if self.code:
            return f"node {self.rank} exits {self.code} after {self.after:g}s ({restarts})"
        return f"every node exits 0 after {self.after:g}s ({restarts})"


@dataclass(frozen=True)
class Role:
    kind: Literal["lease", "run", "hostile", "largest"] = "lease"
    work: Work | None = None  # for kind run
    cancel_at: str | None = None  # a cancel point (chaos/cancels.py POINTS)
    hostile: str | None = None  # a hostile case (chaos/hostile.py CASES)
    impersonates: str | None = None  # the impostor's real job: the name its spec carries
    mid_step: bool = False  # its provisioning timeout lands while its creates are in flight
    hedged: bool = False  # placement.hedge, its first attempt hung
    waits: bool = False  # its first creates sold out on every offer

    def describe(self) -> str:
        parts = [self.kind]
        if self.work is not None:
            parts.append(self.work.describe())
        if self.hostile is not None:
            parts.append(self.hostile)
        if self.impersonates is not None:
            parts.append(f"named {self.impersonates}")
        if self.cancel_at is not None:
            parts.append(f"cancel at {self.cancel_at}")
        if self.mid_step:
            parts.append(f"times out at {MID_STEP_TIMEOUT}s with its creates in flight")
        if self.hedged:
            parts.append(
                f"hedged: its first attempt hangs, a second races it after {HEDGE_AFTER_SECONDS:g}s"
            )
        if self.waits:
            parts.append(f"waits: its first creates are sold out ({STOCKOUT_ROUNDS} per node)")
        return "; ".join(parts)


@dataclass(frozen=True)
class Mix:
    cancel_fraction: float = 0.1
    run_fraction: float = 0.25
    hostile_fraction: float = 0.05
    mid_step_fraction: float = 0.05
    largest: int = 0  # jobs of LARGEST_NODES nodes
    hedged_fraction: float = 0.05
    waiting_fraction: float = 0.05


def _share(fraction: float, jobs: int) -> int:
    """round(jobs * fraction), at least one when the fraction is not 0 and jobs >= 3."""
    if fraction <= 0:
        return 0
    return max(1 if jobs >= 3 else 0, round(jobs * fraction))


class _Deck:
    """Cards dealt in rounds, each a shuffle of every card; with `first_as_given` the first
    round is dealt in the order given (so a run with one card gets the first)."""

    def __init__(self, rng: random.Random, cards: list[object], first_as_given: bool) -> None:
        self.rng, self.cards, self.left = rng, cards, list(reversed(cards))
        if not first_as_given:
            rng.shuffle(self.left)

    def deal(self) -> object:
        if not self.left:
            self.left = list(self.cards)
            self.rng.shuffle(self.left)
        return self.left.pop()


def assign_roles(seed: int, names: list[str], nodes: list[int], mix: Mix) -> list[Role]:
    """One role per job, in the order of `names` (which is the order of arrival)."""
    rng = random.Random(f"{seed}/mix")
    count = len(names)
    roles: dict[int, Role] = {}
    free = list(range(count))

    def take(how_many: int, pool: list[int]) -> list[int]:
        chosen = sorted(rng.sample(pool, min(how_many, len(pool))))
        for index in chosen:
            free.remove(index)
        return chosen

    # The largest job arrives in the first half of the window, while disruptions happen.
    middle = [i for i in free if count // 5 <= i <= max(count // 2, count // 5)]
    for index in take(mix.largest, middle or free):
        roles[index] = Role("largest")
    cancels = _Deck(rng, list(POINTS), first_as_given=False)
    for index in take(_share(mix.cancel_fraction, count), free):
        point = str(cancels.deal())
        if point == "running":
            work = Work("until_stopped", max_restarts=rng.choice((0, 1)))
            roles[index] = Role("run", work=work, cancel_at=point)
        else:
            roles[index] = Role("lease", cancel_at=point)
    hostile = take(_share(mix.hostile_fraction, count), free)
    cards = ["kill-restart", "exit-code", "kill-last", "exit-0", "partition"]
    works = _Deck(rng, cards, first_as_given=True)
    partitions = _Deck(rng, list(PARTITIONS), first_as_given=True)
    for index in take(_share(mix.run_fraction, count), free):
        card = str(works.deal())
        if card == "partition":
            card = f"partition-{partitions.deal()}"
        roles[index] = Role("run", work=_work(rng, card, nodes[index]))
    leases = [i for i in free if i not in roles]  # plain leases: an impostor's real job
    cases = _Deck(rng, [IMPOSTOR, *sorted(set(CASES) - {IMPOSTOR})], first_as_given=True)
    for index in hostile:
        case = str(cases.deal())
        target = None
        while case == IMPOSTOR and not leases:  # nobody to impersonate
            case = str(cases.deal())
        if case == IMPOSTOR:
            target = names[rng.choice(leases)]
        roles[index] = Role("hostile", hostile=case, impersonates=target)
    # Drawn last, from a generator of its own, among the plain leases no impostor names: the
    # rest of a seed's plan is what it was before this role existed.
    named = {role.impersonates for role in roles.values()}
    plain = [i for i in range(count) if i not in roles and names[i] not in named]
    chosen = random.Random(f"{seed}/mid-step")
    for index in sorted(
        chosen.sample(plain, min(_share(mix.mid_step_fraction, count), len(plain)))
    ):
        roles[index] = Role("lease", mid_step=True)
    # Hedged and waiting jobs likewise, each from a generator of its own, after the others.
    for label, fraction, role in (
        ("hedged", mix.hedged_fraction, Role("lease", hedged=True)),
        ("waiting", mix.waiting_fraction, Role("lease", waits=True)),
    ):
        plain = [i for i in range(count) if i not in roles and names[i] not in named]
        drawn = random.Random(f"{seed}/{label}")
        for index in drawn.sample(plain, min(_share(fraction, count), len(plain))):
            roles[index] = role
    return [roles.get(index, Role()) for index in range(count)]


def hedge_rule(job: str) -> FaultRule:
    """Every machine of the job's first attempt stays Pending for good."""
    return FaultRule(
        primitive="create",
        effect="boot_hang",
        vm=f"{job}-a1-",
        message=f"chaos: {job}'s first attempt never boots (a hedge races it)",
    )


def stockout_rule(job: str, nodes: int) -> FaultRule:
    """The job's first creates, on whichever offer, are sold out."""
    return FaultRule(
        primitive="create",
        kind=ErrorKind.CAPACITY,
        vm=f"{job}-a",
        times=STOCKOUT_ROUNDS * nodes,
        message=f"chaos: sold out for {job}",
    )


def mid_step_rule(job: str) -> FaultRule:
    """Every create of the job's first attempt lands after its provisioning timeout."""
    return FaultRule(
        primitive="create",
        effect="lands_late",
        delay_seconds=MID_STEP_CREATE_SECONDS,
        vm=f"{job}-a1-",
        message=f"chaos: {job}'s creates land after its provisioning timeout",
    )


def partition_rules(job: str, work: Work) -> list[FaultRule]:
    """The partitioned node's create (its first attempt's, so that nothing else fails it over
    first: no random rule is aimed at such a job) and, where it is planned so, its delete. The
    player cuts the node off once it has run its work `cut_after` seconds (chaos/nodes.py)."""
    node = f"{job}-a1-n{work.rank}-"
    rules = [
        FaultRule(
            primitive="create",
            effect="partitioned",
            delay_seconds=PARTITION_BACKSTOP,
            vm=node,
            times=1,
            message=f"chaos: node {work.rank} of {job} is cut off from the API",
        )
    ]
    if work.delete_fails:  # every delete of it, until the calm reconcile pass
        rules.append(
            FaultRule(
                primitive="delete",
                kind=ErrorKind.FAILED,
                vm=node,
                message=f"chaos: the partitioned node {work.rank} of {job} cannot be deleted",
            )
        )
    return rules


def _work(rng: random.Random, card: str, nodes: int) -> Work:
    rank = rng.randrange(nodes)
    after = round(rng.uniform(1.0, 4.0), 2)
    if card.startswith("partition-"):
        partition: Partition = card.removeprefix("partition-")  # type: ignore[assignment]
        restarts = 0 if partition == "last" else 1
        cut_after = round(rng.uniform(1.0, 4.0), 2)
        return Work("partition", rank, 0, after, restarts, partition, cut_after)
    if card == "kill-restart":
        return Work("kill", rank=rank, after=after, max_restarts=1)
    if card == "kill-last":
        return Work("kill", rank=rank, after=after, max_restarts=0)
    code = rng.choice(EXIT_CODES) if card == "exit-code" else 0
    return Work("exit", rank=rank, code=code, after=after, max_restarts=rng.choice((0, 1)))
