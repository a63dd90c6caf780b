"""A job against its team's budget: pure functions of the admission, the offers and the spend.

At admission the job learns what is left of its team's monthly budget (activities/teams.py).
Every offer is then held against it: its estimate is the offer's hourly quote for every node
over the job's `max_runtime_seconds`, or over its first hour without one. An offer whose
estimate exceeds what is left is ruled out, saying so; so is an offer with no USD-per-hour quote
while the team has a budget (what it would cost cannot be known, and a price is never
invented). A job left with no offer for that reason is refused, naming the budget and what is
left. While the job holds machines it reads the team's spend every `check_seconds`; past the
budget it is released or warned, by the team's `on_exceed`.
"""

from __future__ import annotations

from activities.teams import Admission
from gpuprov.models import JobSpec, TeamSpend
from providers.base import Offer

CURRENCY = "USD"


def hours_of(spec: JobSpec) -> tuple[float, str]:
    """The hours an estimate covers, and how to say it."""
    if spec.max_runtime_seconds is not None:
        return spec.max_runtime_seconds / 3600, f"max_runtime_seconds {spec.max_runtime_seconds}"
    return 1.0, "its first hour (no max_runtime_seconds)"


def estimate(offer: Offer, spec: JobSpec) -> float | None:
    """USD for every node over the hours the estimate covers; None without a USD/hour quote."""
    price = offer.price
    if price is None or price.currency != CURRENCY or price.unit != "hour":
        return None
    return price.amount * spec.nodes * hours_of(spec)[0]


def budget_reason(offer: Offer, spec: JobSpec, admission: Admission | None) -> str | None:
    """Why the team's budget rules `offer` out, or None."""
    if admission is None or admission.left_usd is None:
        return None
    cost = estimate(offer, spec)
    team = admission.team
    if cost is None:
        return f"no USD/hour quote, so no estimate against the budget of team {team!r}"
    if cost > admission.left_usd:
        _, over = hours_of(spec)
        return (
            f"estimate {cost:.2f} USD ({spec.nodes} node(s) over {over}) > the "
            f"{max(admission.left_usd, 0):.2f} USD left of the monthly budget of team {team!r}"
        )
    return None


def refused_message(admission: Admission, spec: JobSpec, offers: list[Offer]) -> str:
    """A job whose every offer the budget ruled out."""
    estimates = [cost for offer in offers if (cost := estimate(offer, spec)) is not None]
    cheapest = f"; the cheapest offer's estimate is {min(estimates):.2f} USD" if estimates else ""
    _, over = hours_of(spec)
    return (
        f"refused: the monthly budget of team {admission.team!r} is "
        f"{admission.monthly_budget_usd or 0:.2f} USD, {admission.spent_usd:.2f} spent this "
        f"month, {max(admission.left_usd or 0, 0):.2f} left{cheapest} "
        f"({spec.nodes} node(s) over {over})"
    )


def over_budget(spend: TeamSpend) -> bool:
    return spend.monthly_budget_usd is not None and spend.spent_usd > spend.monthly_budget_usd


def exceeded_message(spend: TeamSpend) -> str:
    return (
        f"team {spend.team!r} passed its monthly budget: {spend.spent_usd:.2f} of "
        f"{spend.monthly_budget_usd or 0:.2f} USD spent this month (on_exceed = "
        f"{spend.on_exceed})"
    )
