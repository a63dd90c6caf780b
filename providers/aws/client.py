"""The AWS API client: aiobotocore (signing, XML and JSON protocols), one client per region.
EC2 does the work; SSM resolves a `resolve:ssm:` image and the Price List API prices offers.

Every call goes through `Ec2Api.call`, which turns any failure into a classified ProviderError
(providers/aws/errors.py). The SDK's own retries are off (`total_max_attempts = 1`): a
stockout arrives as HTTP 500 and the SDK would otherwise retry it, and the core's ErrorKind
policy, not the SDK, decides what is retried. Requests and their parameters (user data carries
a join token) are never logged here.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore import exceptions as boto
from botocore import session as botocore_session
from botocore import xform_name

from providers.aws.config import AwsConfig
from providers.aws.errors import error_code, from_exception
from providers.errors import ErrorKind, ProviderError
from providers.settings import MissingCredentials

MAX_PAGES = 100  # a NextToken chain longer than this is a broken endpoint, not a big account


@dataclass(frozen=True)
class StaticCredentials:
    """Explicit keys (tests): the chain is then not consulted at all."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def check_chain(profile: str | None) -> None:
    """MissingCredentials unless the standard AWS chain finds credentials (for `profile`)."""
    how = (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, configure ~/.aws/credentials or SSO "
        "(`aws configure`), run with an instance or container role, or set `profile` in "
        "[providers.aws]"
    )
    try:
        found = botocore_session.Session(profile=profile).get_credentials()
    except boto.ProfileNotFound:
        raise MissingCredentials(f"AWS profile {profile!r} not found: {how}") from None
    except boto.BotoCoreError as error:
        raise MissingCredentials(f"AWS credentials unusable ({error}): {how}") from None
    if found is None:
        raise MissingCredentials(f"no AWS credentials: {how}")


class Ec2Api:
    """Lazily opened aiobotocore clients (EC2 and SSM per region, Price List once), closed by
    aclose."""

    def __init__(
        self,
        config: AwsConfig,
        credentials: StaticCredentials | None = None,
        session: AioSession | None = None,
    ) -> None:
        """`session` (tests): share one SDK session, so its parsed API models are loaded once."""
        self._config = config
        self._credentials = credentials
        self._session = session or AioSession(profile=None if credentials else config.profile)
        self._sdk_config = AioConfig(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=min(10.0, config.request_timeout),
            read_timeout=config.request_timeout,
            user_agent_extra="gpuprov",
        )
        self._clients: dict[tuple[str, str], Any] = {}
        self._stack = AsyncExitStack()
        self._lock = asyncio.Lock()
        self._chain_secrets: tuple[str, ...] = ()  # what the chain found, as of the last client

    def secrets(self) -> tuple[str, ...]:
        """The secret key and session token this API signs with: the core scrubs them out of
        messages (the access key id is an identifier, and EC2 quotes it in its own errors)."""
        keys = self._credentials
        if keys is not None:
            return tuple(value for value in (keys.secret_access_key, keys.session_token) if value)
        return self._chain_secrets

    async def call(
        self, region: str, operation: str, ok_codes: frozenset[str] = frozenset(), **params: Any
    ) -> dict[str, Any] | None:
        """One EC2 call. An error whose code is in `ok_codes` returns None (e.g. a Duplicate)."""
        return await self._call("ec2", region, operation, ok_codes, params)

    async def must(self, region: str, operation: str, **params: Any) -> dict[str, Any]:
        """One EC2 call whose answer is needed."""
        answer = await self._call("ec2", region, operation, frozenset(), params)
        assert answer is not None  # no ok_codes: an error raised
        return answer

    async def pages(self, region: str, operation: str, key: str, **params: Any) -> list[Any]:
        """Every item of `key` across the NextToken pages of one EC2 listing."""
        items: list[Any] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.must(region, operation, **params, **_next(token))
            found = page.get(key, [])
            if not isinstance(found, list):
                raise ProviderError(ErrorKind.FAILED, f"{operation}: {key} is not a list")
            items.extend(found)
            token = page.get("NextToken")
            if not token:
                return items
        raise ProviderError(ErrorKind.FAILED, f"{operation}: more than {MAX_PAGES} pages")

    async def ssm_parameter(self, region: str, name: str) -> str:
        """The value of one SSM parameter (GetParameter), e.g. an AMI id AWS publishes under
        /aws/service/...; ParameterNotFound when the region has none of that name."""
        answer = await self._call("ssm", region, "GetParameter", frozenset(), {"Name": name})
        value = ((answer or {}).get("Parameter") or {}).get("Value")
        if not isinstance(value, str) or not value:
            raise ProviderError(ErrorKind.FAILED, f"GetParameter {name}: no value")
        return value

    async def price_pages(self, **params: Any) -> list[Any]:
        """Every PriceList entry of one Price List GetProducts query (us-east-1 endpoint)."""
        entries: list[Any] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = await self._call(
                "pricing", self._config.pricing_region, "GetProducts", frozenset(),
                {**params, **_next(token)},
            )  # fmt: skip
            assert page is not None
            found = page.get("PriceList", [])
            if not isinstance(found, list):
                raise ProviderError(ErrorKind.FAILED, "GetProducts: PriceList is not a list")
            entries.extend(found)
            token = page.get("NextToken")
            if not token:
                return entries
        raise ProviderError(ErrorKind.FAILED, f"GetProducts: more than {MAX_PAGES} pages")

    async def aclose(self) -> None:
        async with self._lock:
            self._clients.clear()
            await self._stack.aclose()

    async def _call(
        self,
        service: str,
        region: str,
        operation: str,
        ok_codes: frozenset[str],
        params: dict[str, Any],
    ) -> dict[str, Any] | None:
        try:
            client = await self._client(service, region)
            answer = await getattr(client, xform_name(operation))(**params)
        except boto.ClientError as error:
            if error_code(error) in ok_codes:
                return None
            raise from_exception(error, operation) from None
        except Exception as error:  # network, SDK, credentials: classified, never raw
            raise from_exception(error, operation) from None
        if not isinstance(answer, dict):
            raise ProviderError(ErrorKind.FAILED, f"{operation}: unreadable answer")
        return answer

    async def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        if (client := self._clients.get(key)) is not None:
            return client
        async with self._lock:
            if (client := self._clients.get(key)) is None:
                endpoint = (
                    self._config.pricing_endpoint
                    if service == "pricing"
                    else self._config.endpoint_url
                )
                keys = self._credentials
                creator = self._session.create_client(
                    service,
                    region_name=region,
                    endpoint_url=endpoint,
                    config=self._sdk_config,
                    aws_access_key_id=keys.access_key_id if keys else None,
                    aws_secret_access_key=keys.secret_access_key if keys else None,
                    aws_session_token=keys.session_token if keys else None,
                )
                client = await self._stack.enter_async_context(creator)
                self._clients[key] = client
                if self._credentials is None:
                    await self._remember_chain_secrets()
        return client

    async def _remember_chain_secrets(self) -> None:
        # What the session's chain found for the client just made (the SDK signs with it).
        found = await self._session.get_credentials()
        if found is not None:
            frozen = await found.get_frozen_credentials()
            self._chain_secrets = tuple(v for v in (frozen.secret_key, frozen.token) if v)


def _next(token: str | None) -> dict[str, str]:
    return {"NextToken": token} if token else {}
