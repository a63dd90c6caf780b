"""A job's output as its nodes send it: chunks in the database, capped per job, read in order.

    LogRecords.append(work, seq, stream, data, cap)  POST /v1/work/{id}/logs: one chunk, kept
                                                     once per (work, seq)
    LogRecords.chunks(job, run, after, node, limit)  GET /v1/jobs/{job}/logs, `gpuprov logs`,
                                                     GpuprovClient.logs: in arrival order
    Lines                                            chunks -> LogLine, one per line of output
    read_lines(database_url, job, node, running,     the lines of one run of the job (its
               run)                                  latest by default), read on while
                                                     `running()` says the job runs
                                                     (`gpuprov logs --follow`)

A node's agent sends its chunks one at a time and in order, so arrival order (the id) is each
node's own order. Every chunk belongs to the run of its work row (gpuprov/store/runs.py): a name
submitted again starts with no output, and an earlier run's stays readable. A run keeps at most
`[jobs] log_cap_bytes` of output: past that its oldest chunks are deleted, and one note (stream
`gpuprov`, seq -1) says how many bytes were dropped in all. The running counts live in
`log_usage`, one row per run, written in the chunk's own transaction, so the cap costs one row's
update rather than a sum over every chunk of the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from gpuprov.store.db import Database, LogChunk, LogUsage, WorkRecord, dialect_insert, utcnow
from gpuprov.store.runs import pick_run
from providers.base import Model

NOTE_STREAM = "gpuprov"  # the control plane's own words in a job's output
NOTE_SEQ = -1  # a note's seq: nodes number their chunks from 0
DROP_BATCH = 500
PAGE = 1000  # chunks per read
FOLLOW_EVERY = 1.0  # seconds between reads while following a running job


class LogChunkView(Model):
    """One chunk as readers get it."""

    id: int  # arrival order; pass the last one seen as `after` to read what came since
    epoch: int  # the job's restarts before this run of the work (0: the first)
    node: int  # the node's rank
    stream: str  # stdout, stderr, or gpuprov (a note of the control plane's)
    seq: int
    data: str
    at: datetime


class LogPage(Model):
    chunks: list[LogChunkView]
    next_after: int  # `after` for the next page (the last id here, or the one given)
    run: str | None = None  # the run read (the API's answer says which: its latest by default)


class LogLine(Model):
    """One line of a job's output (without its newline)."""

    epoch: int
    node: int
    stream: str
    text: str
    at: datetime


def clean_text(text: str) -> str:
    """Text every database stores: a NUL (PostgreSQL's text refuses it) becomes U+FFFD. (A lone
    surrogate never gets this far: the API's validation refuses it.)"""
    return text.replace("\x00", "\ufffd")


def cap_note(dropped: int, cap: int) -> str:
    return (
        f"{dropped} bytes of this job's oldest output were dropped: a job keeps its last "
        f"{cap} bytes ([jobs] log_cap_bytes)\n"
    )


def _chunk(work: WorkRecord, seq: int, stream: str, data: str) -> LogChunk:
    """A chunk of `work`'s output, its size in UTF-8 bytes (what the cap counts)."""
    return LogChunk(
        job=work.job,
        run=work.run,
        work_id=work.id,
        epoch=work.epoch,
        node_rank=work.node_rank,
        seq=seq,
        stream=stream,
        data=data,
        size=len(data.encode("utf-8")),
        created_at=utcnow(),
    )


class LogRecords:
    def __init__(self, db: Database) -> None:
        self.db = db

    def append(self, work: WorkRecord, seq: int, stream: str, data: str, cap: int) -> bool:
        """Keep one chunk of `work`'s output; False when (work, seq) is kept already (a repeat).
        Past `cap` bytes for the run the oldest chunks go, and the run's note says so."""
        chunk = _chunk(work, seq, stream, clean_text(data))
        with self.db.session() as session:
            repeat = session.exec(
                select(LogChunk.id).where(LogChunk.work_id == work.id, LogChunk.seq == seq)
            ).first()
            if repeat is not None:
                return False
            session.add(chunk)
            try:
                session.flush()
            except IntegrityError:  # the same chunk, sent twice at once: one of them is kept
                session.rollback()
                return False
            kept = session.execute(self._count(work, chunk.size)).scalar_one()
            if kept > cap:
                self._drop_oldest(session, work, kept - cap, cap)
            session.commit()
        return True

    def _count(self, work: WorkRecord, size: int) -> Any:
        """Add `size` to the run's kept bytes (its row created by its first chunk)."""
        insert = dialect_insert(self.db.dialect)
        now = utcnow()
        statement = insert(LogUsage).values(
            job=work.job, run=work.run, kept_bytes=size, dropped_bytes=0, updated_at=now
        )
        return statement.on_conflict_do_update(
            index_elements=["job", "run"],
            set_={"kept_bytes": LogUsage.kept_bytes + size, "updated_at": now},
        ).returning(LogUsage.kept_bytes)

    def _drop_oldest(self, session: Any, work: WorkRecord, excess: int, cap: int) -> None:
        """Delete the run's oldest chunks until `excess` bytes are gone; the note says how many
        bytes were dropped since the run began."""
        doomed: list[int] = []
        dropped, after = 0, 0
        while dropped < excess:
            batch = session.exec(
                select(LogChunk.id, LogChunk.size)
                .where(
                    LogChunk.job == work.job,
                    LogChunk.run == work.run,
                    col(LogChunk.stream) != NOTE_STREAM,
                    col(LogChunk.id) > after,
                )
                .order_by(col(LogChunk.id))
                .limit(DROP_BATCH)
            ).all()
            if not batch:
                break
            for chunk_id, size in batch:
                if dropped >= excess:
                    break
                doomed.append(chunk_id)
                dropped += size
            after = batch[-1][0]
        session.exec(sa.delete(LogChunk).where(col(LogChunk.id).in_(doomed)))
        total = session.execute(
            sa.update(LogUsage)
            .where(col(LogUsage.job) == work.job, col(LogUsage.run) == work.run)
            .values(
                kept_bytes=LogUsage.kept_bytes - dropped,
                dropped_bytes=LogUsage.dropped_bytes + dropped,
            )
            .returning(LogUsage.dropped_bytes)
        ).scalar_one()
        session.exec(
            sa.delete(LogChunk).where(
                col(LogChunk.job) == work.job,
                col(LogChunk.run) == work.run,
                col(LogChunk.stream) == NOTE_STREAM,
            )
        )
        session.add(_chunk(work, NOTE_SEQ, NOTE_STREAM, cap_note(total, cap)))

    def chunks(
        self,
        job: str,
        after: int = 0,
        node: int | None = None,
        limit: int = 1000,
        run: str | None = None,
    ) -> LogPage:
        """The job's chunks that arrived after the chunk `after`, oldest first; of one run's
        with `run`, of one node's with `node` (the control plane's notes always)."""
        query = select(LogChunk).where(LogChunk.job == job, col(LogChunk.id) > after)
        if run is not None:
            query = query.where(LogChunk.run == run)
        if node is not None:
            query = query.where(
                sa.or_(col(LogChunk.node_rank) == node, col(LogChunk.stream) == NOTE_STREAM)
            )
        with self.db.session() as session:
            rows = session.exec(query.order_by(col(LogChunk.id)).limit(limit)).all()
        views = [
            LogChunkView(
                id=row.id or 0,
                epoch=row.epoch,
                node=row.node_rank,
                stream=row.stream,
                seq=row.seq,
                data=row.data,
                at=row.created_at,
            )
            for row in rows
        ]
        return LogPage(chunks=views, next_after=views[-1].id if views else after)


class Lines:
    """Chunks into lines: a line split across chunks comes out whole, once its newline has
    come (or at `flush`, the end of the output)."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, int, str], tuple[str, datetime]] = {}

    def feed(self, chunks: Iterable[LogChunkView]) -> list[LogLine]:
        lines = []
        for chunk in chunks:
            key = (chunk.epoch, chunk.node, chunk.stream)
            before, at = self._partial.pop(key, ("", chunk.at))
            *complete, rest = (before + chunk.data).split("\n")
            lines += [LogLine(epoch=key[0], node=key[1], stream=key[2], text=text, at=at)
                      for text in complete]  # fmt: skip
            if rest:
                self._partial[key] = (rest, chunk.at if complete else at)
        return lines

    def flush(self) -> list[LogLine]:
        lines = [
            LogLine(epoch=epoch, node=node, stream=stream, text=text, at=at)
            for (epoch, node, stream), (text, at) in self._partial.items()
        ]
        self._partial.clear()
        return lines


def prefixed(line: LogLine) -> str:
    """A line as `gpuprov logs` prints it: its node's rank first ([1] ...), and the restart it
    ran in after a restart ([1 r2] ...); the control plane's notes as [gpuprov]."""
    if line.stream == NOTE_STREAM:
        return f"[gpuprov] {line.text}"
    restart = f" r{line.epoch}" if line.epoch else ""
    return f"[{line.node}{restart}] {line.text}"


async def read_lines(
    database_url: str,
    job: str,
    node: int | None = None,
    running: Callable[[], Awaitable[bool]] | None = None,
    poll_interval: float = FOLLOW_EVERY,
    run: str | None = None,
) -> AsyncIterator[LogLine]:
    """One run's output as lines (`run`, else the job's latest run: RunNotFound for a run the
    name never had), read from the database as it stands; with `running`, read on while it
    answers True and once more after (what the nodes sent before the job ended is in by then:
    an agent sends all its output before it reports the end)."""
    database = Database(database_url)
    records, lines, after = LogRecords(database), Lines(), 0
    try:
        chosen = await asyncio.to_thread(pick_run, database, job, run)
        while True:
            more = running is not None and await running()
            while True:
                page = await asyncio.to_thread(records.chunks, job, after, node, PAGE, chosen)
                for line in lines.feed(page.chunks):
                    yield line
                after = page.next_after
                if len(page.chunks) < PAGE:
                    break
            if not more:
                break
            await asyncio.sleep(poll_interval)
        for line in lines.flush():
            yield line
    finally:
        database.dispose()
