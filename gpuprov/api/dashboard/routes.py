"""The dashboard's pages, served by the API under /ui (server-rendered; no build step):

    GET  /ui/login, POST /ui/login, POST /ui/logout     sign in with an API key (session.py)
    GET  /ui/                                           the jobs, filtered by state/team/provider
    GET  /ui/jobs/{name}                                one job: attempts, blocks, nodes, logs, cost
    GET  /ui/jobs/{name}/logs?after=N[&run=R]           its output since chunk N (the page's
                                                        script follows the logs with it)
    POST /ui/jobs/{name}/release | cancel               a member of the job's team
    GET  /ui/workers; POST /ui/workers/{id}/drain|undrain   liveness; draining is an admin's
    GET  /ui/spend                                      teams against budgets, providers

A page reads what the API's routes read, under the same roles and teams (a viewer sees its
team's, an admin every team's); a button is shown only to a caller the route would let act, and
the route checks again. No page renders a secret: keys, tokens and credentials never reach a
template, and work output is stored already redacted. Pages are sent with `no-store` and a
Content-Security-Policy that allows this site's own script and style only.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuprov.api import jobs as api_jobs
from gpuprov.api.auth import Guard, guard
from gpuprov.api.dashboard import views
from gpuprov.api.dashboard.session import (
    COOKIE,
    CSRF_FIELD,
    Session,
    SignedOut,
    clear_cookie,
    form,
    lookup,
    same_origin,
    set_cookie,
    signed_in,
)
from gpuprov.api.scope import teams_of, worker_visible
from gpuprov.api.workers import summary
from gpuprov.models import JOB_NAME_PATTERN, TEAM_NAME_PATTERN, JobState, workflow_id_for
from gpuprov.sdk.client import GpuprovError
from gpuprov.store.liveness import Liveness
from gpuprov.store.logs import LogRecords
from gpuprov.store.records import Records
from providers import PROVIDER_IDS

HERE = Path(__file__).parent
PAGE_SIZE = 50
LOG_PAGE = 1000
_JOB_NAME = re.compile(JOB_NAME_PATTERN)
_TEAM_NAME = re.compile(TEAM_NAME_PATTERN)
_RUN = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_WORKER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _money(amounts: dict[str, float] | None) -> str:
    if not amounts:
        return "—"
    return ", ".join(f"{amount:,.2f} {currency}" for currency, amount in sorted(amounts.items()))


def _age(since: datetime | None, until: datetime | None = None) -> str:
    if since is None:
        return "—"
    seconds = int(((until or datetime.now(since.tzinfo)) - since).total_seconds())
    if seconds < 0:
        return "0s"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment is not None else "—"


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters.update(money=_money, age=_age, when=_when)
    templates.env.globals.update(states=[state.value for state in JobState], providers=PROVIDER_IDS)
    return templates


def _secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _in_ui(request: Request) -> bool:
    return request.url.path == "/ui" or request.url.path.startswith("/ui/")


def _records(request: Request) -> Records:
    return request.app.state.records


def add_routes(app: FastAPI, temporal_ui_url: str | None, namespace: str) -> None:
    templates = _templates()
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    def page(
        request: Request, name: str, session: Session | None, status: int = 200, **context: Any
    ) -> Response:
        caller = session.caller if session is not None else None
        response = templates.TemplateResponse(
            request,
            name,
            {"caller": caller, "csrf": session.csrf if session else None, **context},
            status_code=status,
        )
        return _secured(response)

    def sign_in_page(request: Request, message: str | None, status: int) -> Response:
        return page(request, "login.html", None, status, message=message)

    async def signed_out(request: Request, error: Exception) -> Response:
        assert isinstance(error, SignedOut)
        if error.message is None:  # no cookie at all: to the sign-in form
            response = RedirectResponse("/ui/login", status_code=303)
            return _secured(response)
        response = sign_in_page(request, error.message, error.status)
        clear_cookie(response)
        return response

    async def refused(request: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        if not _in_ui(request):
            return await http_exception_handler(request, error)
        if request.url.path.endswith("/logs"):
            return JSONResponse({"detail": error.detail}, status_code=error.status_code)
        # The header (and its sign-out) for a signed-in caller: only a live key's cookie.
        key = request.cookies.get(COOKIE, "")
        caller = await lookup(request, key) if key else None
        response = page(
            request,
            "error.html",
            Session(caller, key) if caller is not None else None,
            error.status_code,
            code=error.status_code,
            detail=error.detail,
        )
        response.headers.update(error.headers or {})  # Retry-After, Connection: close
        return response

    app.add_exception_handler(SignedOut, signed_out)
    app.add_exception_handler(StarletteHTTPException, refused)

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return _secured(RedirectResponse("/ui/", status_code=307))

    @app.get("/ui/login", include_in_schema=False)
    async def login_form(request: Request) -> Response:
        return sign_in_page(request, None, 200)

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request, throttle: Annotated[Guard, Depends(guard)]) -> Response:
        same_origin(request)
        key = (await form(request)).get("key", "").strip()
        if not key:
            return sign_in_page(request, "Enter an API key (gpuprov apikey create).", 401)
        caller = await lookup(request, key)
        if caller is None:
            refusal = throttle.refused(key, "unknown or revoked operator API key")
            if refusal.status_code == 429:
                raise refusal
            return sign_in_page(request, "That key is unknown or revoked.", 401)
        response = RedirectResponse("/ui/", status_code=303)
        set_cookie(request, response, key)
        return _secured(response)

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request, session: Annotated[Session, Depends(signed_in)]) -> Response:
        same_origin(request)
        session.check_csrf((await form(request)).get(CSRF_FIELD))
        response = RedirectResponse("/ui/login", status_code=303)
        clear_cookie(response)
        return _secured(response)

    @app.get("/ui/", include_in_schema=False)
    async def jobs_page(
        request: Request,
        session: Annotated[Session, Depends(signed_in)],
        records: Annotated[Records, Depends(_records)],
        state: str = "",
        team: str = "",
        provider: str = "",
        page_token: str = "",
    ) -> Response:
        caller = session.caller
        filters = {"state": state, "team": team, "provider": provider}
        problem = _filter_problem(state, team, provider)
        if problem is None and team:
            caller.check_reads(team, "the jobs")
        rows: list[views.JobRow] = []
        next_token: str | None = None
        unavailable: str | None = None
        if problem is None:
            try:
                jobs = await api_jobs.jobs_client(request)
                found, token = await jobs.list_page(
                    state=JobState(state) if state else None,
                    provider=provider or None,
                    team=team or caller.team,
                    page_size=PAGE_SIZE,
                    page_token=api_jobs.decode_page_token(page_token or None),
                )
                rows = await views.job_rows(records.db, found)
                next_token = api_jobs.encode_page_token(token)
            except GpuprovError as error:
                unavailable = f"Temporal cannot be reached now: {error}"
            except HTTPException as error:
                if error.status_code != 503:
                    raise
                unavailable = str(error.detail)
        next_url = None
        if next_token:
            next_url = "/ui/?" + urlencode({**filters, "page_token": next_token})
        return page(
            request,
            "jobs.html",
            session,
            rows=rows,
            filters=filters,
            problem=problem,
            unavailable=unavailable,
            next_url=next_url,
        )

    @app.get("/ui/jobs/{name}", include_in_schema=False)
    async def job_page(
        request: Request,
        name: str,
        session: Annotated[Session, Depends(signed_in)],
        records: Annotated[Records, Depends(_records)],
        done: str = "",
    ) -> Response:
        _check_job_name(name)
        jobs = await api_jobs.jobs_client(request)
        description = await api_jobs.describe_job(jobs, name)
        team = api_jobs.team_in(description)
        session.caller.check_reads(team, f"job {name!r}")
        status = await api_jobs.status_or_none(jobs, name)
        state = description.status.name.lower() if description.status else "unknown"
        temporal_url = None
        if temporal_ui_url:
            base = temporal_ui_url.rstrip("/")
            temporal_url = f"{base}/namespaces/{namespace}/workflows/{workflow_id_for(name)}"
        view = await views.job_page(records.db, name, team, state, status, temporal_url)
        ended = status.state.terminal if status is not None else description.close_time is not None
        return page(
            request,
            "job.html",
            session,
            job=view,
            can_act=session.caller.acts_on(team) and not ended,
            ended=ended,
            done=done if done in ("release", "cancel") else None,
        )

    @app.get("/ui/jobs/{name}/logs", include_in_schema=False)
    async def job_logs(
        request: Request,
        name: str,
        session: Annotated[Session, Depends(signed_in)],
        records: Annotated[Records, Depends(_records)],
        after: int = 0,
        run: str = "",
    ) -> Response:
        """The chunks since `after` (of `run`), for the page's script; JSON, never cached."""
        _check_job_name(name)
        if run and not _RUN.fullmatch(run):
            raise HTTPException(422, "run: not a run id")
        team = await asyncio.to_thread(teams_of(request).team_of, name, run or None)
        if team is None or not session.caller.reads(team):
            raise HTTPException(404, f"no job named {name!r} that this key may read")
        logs = LogRecords(records.db)
        result = await asyncio.to_thread(
            logs.chunks, name, max(0, after), None, LOG_PAGE, run or None
        )
        chunks = [chunk.model_dump(mode="json", include={"id", "epoch", "node", "stream", "data"})
                  for chunk in result.chunks]  # fmt: skip
        body = {"chunks": chunks, "next_after": result.next_after, "more": len(chunks) == LOG_PAGE}
        return _secured(JSONResponse(body))

    for action in ("release", "cancel"):
        _add_job_action(app, action)

    @app.get("/ui/workers", include_in_schema=False)
    async def workers_page(
        request: Request,
        session: Annotated[Session, Depends(signed_in)],
        records: Annotated[Records, Depends(_records)],
    ) -> Response:
        rows = await asyncio.to_thread(records.workers)
        visible = [
            summary(row)
            for row in rows
            if row.state != "revoked" and await worker_visible(request, session.caller, row)
        ]
        return page(request, "workers.html", session, workers=visible)

    for action, draining in (("drain", True), ("undrain", False)):
        _add_drain(app, action, draining)

    @app.get("/ui/spend", include_in_schema=False)
    async def spend_page(
        request: Request,
        session: Annotated[Session, Depends(signed_in)],
        records: Annotated[Records, Depends(_records)],
    ) -> Response:
        caller = session.caller
        teams = teams_of(request)
        names = (
            [team.name for team in await asyncio.to_thread(teams.all)]
            if caller.admin
            else [caller.team]
            if caller.team
            else []
        )
        view = await views.spend_page(
            records.db, teams, names, None if caller.admin else caller.team
        )
        return page(request, "spend.html", session, spend=view)


def _filter_problem(state: str, team: str, provider: str) -> str | None:
    """The first filter that is not one of its values, named."""
    if state and state not in {member.value for member in JobState}:
        return f"state: {state!r} is not a job state"
    if team and not _TEAM_NAME.fullmatch(team):
        return f"team: {team!r} is not a team name"
    if provider and provider not in PROVIDER_IDS:
        return f"provider: {provider!r} is not a provider"
    return None


def _check_job_name(name: str) -> None:
    if not _JOB_NAME.fullmatch(name):
        raise HTTPException(404, f"no job named {name!r}")


def _add_job_action(app: FastAPI, action: str) -> None:
    async def end_job(
        request: Request, name: str, session: Annotated[Session, Depends(signed_in)]
    ) -> Response:
        same_origin(request)
        session.check_csrf((await form(request)).get(CSRF_FIELD))
        _check_job_name(name)
        await api_jobs.end_job(request, session.caller, name, action)
        return _secured(RedirectResponse(f"/ui/jobs/{name}?done={action}", status_code=303))

    app.post(f"/ui/jobs/{{name}}/{action}", include_in_schema=False, name=f"ui_{action}_job")(
        end_job
    )


def _add_drain(app: FastAPI, action: str, draining: bool) -> None:
    async def set_draining(
        request: Request, worker_id: str, session: Annotated[Session, Depends(signed_in)]
    ) -> Response:
        same_origin(request)
        session.check_csrf((await form(request)).get(CSRF_FIELD))
        if not session.caller.admin:
            raise HTTPException(403, f"{action} needs the admin role; this key is a "
                                f"{session.caller.role}")  # fmt: skip
        if not _WORKER_ID.fullmatch(worker_id):
            raise HTTPException(404, f"no worker {worker_id!r}")
        liveness: Liveness = request.app.state.liveness
        row = await asyncio.to_thread(liveness.set_draining, worker_id, draining)
        if row is None:
            raise HTTPException(404, f"no worker {worker_id} that is not revoked")
        return _secured(RedirectResponse("/ui/workers", status_code=303))

    app.post(f"/ui/workers/{{worker_id}}/{action}", include_in_schema=False, name=f"ui_{action}")(
        set_draining
    )
