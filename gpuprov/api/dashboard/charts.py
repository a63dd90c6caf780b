"""Horizontal bar charts as plain numbers for an inline SVG (no script, no chart library).

`bars([(label, value, limit), ...])` scales every bar against the largest value or limit, so a
budget's marker and its team's bar share one axis; a bar past its limit is `over`.
"""

from __future__ import annotations

from collections.abc import Sequence

from providers.base import Model

WIDTH = 100.0  # the bars' axis, in the SVG's own units (the template stretches it)


class Bar(Model):
    label: str
    value: float
    limit: float | None = None
    length: float  # of WIDTH
    limit_at: float | None = None  # where the limit's marker stands, of WIDTH
    over: bool = False


def bars(rows: Sequence[tuple[str, float, float | None]]) -> list[Bar]:
    scale = max([value for _, value, _ in rows] + [limit or 0.0 for _, _, limit in rows] + [0.0])
    unit = WIDTH / scale if scale > 0 else 0.0
    return [
        Bar(
            label=label,
            value=value,
            limit=limit,
            length=round(value * unit, 3),
            limit_at=round(limit * unit, 3) if limit is not None else None,
            over=limit is not None and value > limit,
        )
        for label, value, limit in rows
    ]
