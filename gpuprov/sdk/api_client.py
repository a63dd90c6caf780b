"""The control-plane API as the user commands read it, with an operator API key (httpx, async).

    ApiClient(api_url, api_key, ca_file=None)     Authorization: Bearer gpo_...; for https a
                                                  private CA's PEM, else the system's CAs
    ApiClient.from_settings(settings)             `[client]` (api_url, api_key, ca_file); None
                                                  where no key is configured
    log_page(job, after, node, limit, run)        GET /v1/jobs/{job}/logs -> LogPage
    log_lines(job, node, running, run)            those pages as lines, read on while
                                                  `running()` says the job runs
    cost(job, run, team)                          GET /v1/cost -> CostReport
    workers(state, job)                           GET /v1/workers -> [WorkerSummary]
    drain / undrain / remove(worker_id)           POST .../drain|undrain, DELETE /v1/workers/{id}
    orphans(include_resolved)                     GET /v1/orphans[?all=true] -> OrphansReport
    secret_names / set_secret / delete_secret     GET, PUT, DELETE /v1/secrets[/{name}]
    teams()                                       GET /v1/teams -> [TeamSpend]

Every failure is one GpuprovError line (ApiError, with the status; WorkerNotFound for a worker's
404): the API's own `detail` for a 4xx (401 an unknown or revoked key, 403 a role or team that
does not allow it, 404, 422 naming the parameter), what a 429 or 503 said and its Retry-After,
and "the API at URL cannot be reached: ..." when no answer came. The key is only ever a header:
no message, log line or repr holds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, SecretStr, ValidationError

from gpuprov.config import Settings
from gpuprov.models import TeamSpend, WorkerList, WorkerSummary
from gpuprov.sdk.client import GpuprovError, WorkerNotFound
from gpuprov.store.costs import CostReport
from gpuprov.store.logs import FOLLOW_EVERY, PAGE, Lines, LogLine, LogPage
from gpuprov.store.orphans import OrphansReport
from gpuprov.store.secrets import SecretView

DEFAULT_TIMEOUT = 30.0
MAX_DETAIL = 300  # characters of an answer that is not the API's JSON

Answer = TypeVar("Answer", bound=BaseModel)


class ApiError(GpuprovError):
    """The API refused the call or failed it; `status` is its HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _detail(response: httpx.Response) -> str:
    """The API's `detail`: a string, or a validation error's list (each field and problem)."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list):
        problems = []
        for problem in detail:
            if isinstance(problem, dict):
                where = ".".join(str(part) for part in problem.get("loc") or ())
                problems.append(f"{where}: {problem.get('msg')}" if where else str(problem))
        return "; ".join(problems) or "invalid request"
    if detail is None:
        text = " ".join(response.text.split())
        return text[:MAX_DETAIL] or response.reason_phrase or "no detail"
    return str(detail)


def _retry_after(response: httpx.Response) -> str:
    wait = response.headers.get("retry-after")
    return f"; retry after {wait} s" if wait else ""


class ApiClient:
    """One API, one operator key; a context manager closes its connections."""

    def __init__(
        self,
        api_url: str,
        api_key: str | SecretStr,
        *,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        secret = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        self._http = httpx.AsyncClient(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {secret}"},
            timeout=timeout,
            verify=ca_file if ca_file is not None else True,
            transport=transport,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiClient | None:
        """The client `[client]` configures; None without an API key (read the database)."""
        if settings.client.api_key is None:
            return None
        return cls(
            settings.client_api_url, settings.client.api_key, ca_file=settings.client_ca_file
        )

    def __repr__(self) -> str:
        return f"ApiClient({self.api_url!r})"

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------ logs

    async def log_page(
        self,
        job: str,
        after: int = 0,
        node: int | None = None,
        limit: int = PAGE,
        run: str | None = None,
    ) -> LogPage:
        """The job's chunks after `after` (one run's: its latest unless `run` names one)."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        params |= {
            name: value for name, value in (("node", node), ("run", run)) if value is not None
        }
        answer = await self._call("GET", f"/v1/jobs/{job}/logs", params=params)
        return self._parse(LogPage, answer)

    async def log_lines(
        self,
        job: str,
        node: int | None = None,
        running: Callable[[], Awaitable[bool]] | None = None,
        run: str | None = None,
        poll_interval: float = FOLLOW_EVERY,
    ) -> AsyncIterator[LogLine]:
        """One run's output as lines, as gpuprov.store.logs.read_lines reads it from the
        database: with `running`, read on while it answers True and once more after."""
        lines, after, chosen = Lines(), 0, run
        while True:
            more = running is not None and await running()
            while True:
                page = await self.log_page(job, after, node, PAGE, chosen)
                chosen = page.run if chosen is None else chosen  # the run the first page read
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

    # ------------------------------------------------------------ cost, orphans

    async def cost(
        self, job: str | None = None, run: str | None = None, team: str | None = None
    ) -> CostReport:
        params = {
            name: value for name, value in (("job", job), ("run", run), ("team", team)) if value
        }
        return self._parse(CostReport, await self._call("GET", "/v1/cost", params=params))

    async def orphans(self, include_resolved: bool = False) -> OrphansReport:
        params = {"all": "true"} if include_resolved else {}
        return self._parse(OrphansReport, await self._call("GET", "/v1/orphans", params=params))

    # ------------------------------------------------------------ secrets, teams

    async def secret_names(self, team: str | None = None) -> list[SecretView]:
        params = {"team": team} if team else {}
        answer = await self._call("GET", "/v1/secrets", params=params)
        return [self._parse(SecretView, item) for item in answer]

    async def set_secret(self, name: str, value: str, team: str | None = None) -> SecretView:
        """The value goes in the body only, over the API's TLS; the answer never holds it."""
        params = {"team": team} if team else {}
        answer = await self._call(
            "PUT", f"/v1/secrets/{name}", params=params, json={"value": value}
        )
        return self._parse(SecretView, answer)

    async def delete_secret(self, name: str, team: str | None = None) -> None:
        params = {"team": team} if team else {}
        await self._call("DELETE", f"/v1/secrets/{name}", params=params)

    async def teams(self) -> list[TeamSpend]:
        return [self._parse(TeamSpend, item) for item in await self._call("GET", "/v1/teams")]

    # ------------------------------------------------------------ workers

    async def workers(
        self, state: str | None = None, job: str | None = None
    ) -> list[WorkerSummary]:
        params = {name: value for name, value in (("state", state), ("job", job)) if value}
        answer = await self._call("GET", "/v1/workers", params=params)
        return self._parse(WorkerList, answer).workers

    async def drain(self, worker_id: str) -> WorkerSummary:
        return await self._worker("POST", f"/v1/workers/{worker_id}/drain")

    async def undrain(self, worker_id: str) -> WorkerSummary:
        return await self._worker("POST", f"/v1/workers/{worker_id}/undrain")

    async def remove(self, worker_id: str) -> WorkerSummary:
        return await self._worker("DELETE", f"/v1/workers/{worker_id}")

    async def _worker(self, method: str, path: str) -> WorkerSummary:
        try:
            answer = await self._call(method, path)
        except ApiError as error:
            if error.status == 404:
                raise WorkerNotFound(str(error)) from None
            raise
        return self._parse(WorkerSummary, answer)

    # ------------------------------------------------------------ the call

    async def _call(self, method: str, path: str, **options: Any) -> Any:
        try:
            response = await self._http.request(method, path, **options)
        except httpx.HTTPError as error:
            reason = str(error) or type(error).__name__
            raise ApiError(f"the API at {self.api_url} cannot be reached: {reason}") from None
        if response.status_code >= 400:
            raise self._refusal(response)
        try:
            return response.json()
        except ValueError:
            raise ApiError(
                f"the API at {self.api_url} answered {response.status_code} with no JSON",
                response.status_code,
            ) from None

    def _refusal(self, response: httpx.Response) -> ApiError:
        status, detail = response.status_code, _detail(response)
        where = f"the API at {self.api_url}"
        if status in (429, 503):
            return ApiError(f"{where} answered {status}: {detail}{_retry_after(response)}", status)
        return ApiError(f"{where} answered {status}: {detail}", status)

    def _parse(self, model: type[Answer], answer: Any) -> Answer:
        try:
            return model.model_validate(answer)
        except ValidationError as error:
            raise ApiError(
                f"the API at {self.api_url} answered what this gpuprov cannot read "
                f"({model.__name__}: {error.error_count()} problem(s)); is it another version?"
            ) from None
