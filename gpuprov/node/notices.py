"""The cloud's notices about this machine (`NoticeWatcher`), read from its instance metadata:

    EC2 (IMDSv2)  PUT /latest/api/token (a session token), then GET, every few seconds:
                  meta-data/spot/instance-action           404 until a spot interruption:
                                                           {"action": "terminate", "time": ...}
                  meta-data/events/recommendations/rebalance  404, or {"noticeTime": ...}
                  meta-data/events/maintenance/scheduled   [] or [{"Code", "NotBefore", ...}]
    GCE           GET /computeMetadata/v1/instance/preempted          FALSE / TRUE
                  GET /computeMetadata/v1/instance/maintenance-event  NONE / MIGRATE_... /
                                                                      TERMINATE_ON_HOST_MAINTENANCE
                  (`Metadata-Flavor: Google`; `?wait_for_change=true&last_etag=...` hangs until
                  the value changes, so a preemption is seen within a second)

Each notice is a dict, the shape the heartbeat carries: {"kind": "reclaim" | "maintenance" |
"rebalance", "source": "ec2" | "gce", "action": the cloud's own word, "deadline": ISO-8601 UTC
or None, "detail": one line}. EC2's instance-action and GCE's preemption are reclaims (GCE's
deadline, which it does not publish, is taken as 30 s from when it was seen); a GCE maintenance
that terminates the machine is kind "maintenance" with its action, which the agent and the
control plane treat as a reclaim (GPU machines cannot live-migrate). A metadata service that
does not answer (no such cloud, a blip) means no notice: logged once, tried again, never
raised.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

log = logging.getLogger(__name__)

BASES = {"ec2": "http://169.254.169.254", "gce": "http://metadata.google.internal"}
METADATA_TIMEOUT = 2.0  # seconds per request (the hanging GET: its own wait, plus this)
EC2_POLL = 5.0  # EC2 documents checking every 5 s
GCE_HANG = 30  # seconds a hanging GET waits for a change before it answers anyway
GCE_PREEMPTION_NOTICE = 30.0  # seconds GCE gives a preempted machine
TOKEN_TTL = 21600  # seconds an IMDSv2 token lives
TOKEN_RENEW = TOKEN_TTL - 600
URGENCY = {"reclaim": 0, "maintenance": 1, "rebalance": 2}
MAX_DETAIL = 300


class Unanswered(Exception):
    """The metadata service did not answer (unreachable, timed out, 5xx)."""


def _iso(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017 (datetime.UTC is 3.11+; the agent runs on 3.8)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017 (datetime.UTC is 3.11+; the agent runs on 3.8)


def _notice(kind: str, source: str, action: str, deadline: str | None, detail: str) -> dict:
    return {"kind": kind, "source": source, "action": action[:64], "deadline": deadline,
            "detail": detail[:MAX_DETAIL]}  # fmt: skip


def _deadline(text: object) -> str | None:
    """An ISO-8601 or RFC 2822 time (EC2 writes both) as ISO-8601 UTC; None if unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)  # noqa: UP017 (datetime.UTC is 3.11+; the agent runs on 3.8)
    return _iso(when)


class NoticeWatcher:
    """Watches one cloud's metadata (`source`: "ec2" or "gce"; `base_url` overrides where)."""

    def __init__(self, source: str, base_url: str | None = None, poll_seconds: float = EC2_POLL):
        if source not in BASES:
            raise ValueError(f"no notices are known for {source!r}: ec2 or gce")
        self.source = source
        self.base = (base_url or BASES[source]).rstrip("/")
        self.poll_seconds = poll_seconds
        self._token: str | None = None
        self._token_at = 0.0
        self._etags: dict[str, str] = {}
        self._values: dict[str, str] = {}
        self._preempted_at: str | None = None

    # ------------------------------------------------------------------ one round

    def check(self, hang: bool = False) -> list:
        """The notices present now, most urgent first. `hang` (GCE): wait for a change of the
        preemption flag first. Unanswered when the metadata service does not answer."""
        found = self._ec2() if self.source == "ec2" else self._gce(hang)
        return sorted(found, key=lambda notice: URGENCY[notice["kind"]])

    def _request(self, path: str, method: str = "GET", headers: dict | None = None,
                 timeout: float = METADATA_TIMEOUT) -> tuple:  # fmt: skip
        """(status, body, headers) of one request; 4xx answers are returned, not raised."""
        request = urllib.request.Request(self.base + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read().decode("utf-8", "replace"), answer.headers
        except urllib.error.HTTPError as error:
            if error.code >= 500:
                raise Unanswered(f"{path}: HTTP {error.code}") from None
            return error.code, "", error.headers
        except (OSError, ValueError) as error:  # URLError, refused, timed out
            raise Unanswered(f"{path}: {getattr(error, 'reason', error)}") from None

    def _ec2_get(self, path: str) -> tuple:
        for _ in range(2):  # a 401: the token expired (or the service restarted): a new one
            if self._token is None or time.monotonic() - self._token_at > TOKEN_RENEW:
                status, token, _ = self._request(
                    "/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds":
                                                 str(TOKEN_TTL)})  # fmt: skip
                if status != 200 or not token:
                    raise Unanswered(f"no IMDSv2 token (HTTP {status})")
                self._token, self._token_at = token.strip(), time.monotonic()
            status, body, _ = self._request(
                "/latest/meta-data/" + path, headers={"X-aws-ec2-metadata-token": self._token}
            )
            if status != 401:
                return status, body
            self._token = None
        return 401, ""

    def _ec2(self) -> list:
        found = []
        status, body = self._ec2_get("spot/instance-action")
        action = _json(body) if status == 200 else None
        if isinstance(action, dict) and action.get("action"):
            word, when = str(action["action"]), _deadline(action.get("time"))
            said = f"EC2 spot instance-action: {word} at {when or 'an unknown time'}"
            found.append(_notice("reclaim", "ec2", word, when, said))
        status, body = self._ec2_get("events/recommendations/rebalance")
        rebalance = _json(body) if status == 200 else None
        if isinstance(rebalance, dict):
            said = rebalance.get("noticeTime") or "now"
            found.append(_notice("rebalance", "ec2", "rebalance", None,
                                 f"EC2 rebalance recommendation since {said}"))  # fmt: skip
        status, body = self._ec2_get("events/maintenance/scheduled")
        events = _json(body) if status == 200 else None
        for event in events if isinstance(events, list) else []:
            if not isinstance(event, dict) or event.get("State", "active") != "active":
                continue
            code = str(event.get("Code") or "maintenance")
            when = _deadline(event.get("NotBefore"))
            text = f"EC2 scheduled event {code} from {when or event.get('NotBefore')}"
            found.append(_notice("maintenance", "ec2", code, when, text))
        return found

    def _gce_get(self, key: str, hang: bool) -> str:
        path = f"/computeMetadata/v1/instance/{key}"
        timeout = METADATA_TIMEOUT
        if hang and key in self._etags:
            path += f"?wait_for_change=true&timeout_sec={GCE_HANG}&last_etag={self._etags[key]}"
            timeout += GCE_HANG
        status, body, headers = self._request(path, headers={"Metadata-Flavor": "Google"},
                                              timeout=timeout)  # fmt: skip
        if status != 200:
            raise Unanswered(f"{key}: HTTP {status}")
        if headers is not None and headers.get("ETag"):
            self._etags[key] = headers["ETag"]
        self._values[key] = body.strip().upper()
        return self._values[key]

    def _gce(self, hang: bool) -> list:
        found = []
        if self._gce_get("preempted", hang) == "TRUE":
            if self._preempted_at is None:
                self._preempted_at = _iso(
                    _now() + datetime.timedelta(seconds=GCE_PREEMPTION_NOTICE)
                )
            said = f"GCE preempted the instance (stops by {self._preempted_at})"
            found.append(_notice("reclaim", "gce", "preempted", self._preempted_at, said))
        else:
            self._preempted_at = None
        event = self._gce_get("maintenance-event", False)
        if event and event != "NONE":
            found.append(
                _notice("maintenance", "gce", event, None, f"GCE maintenance-event {event}")
            )
        return found

    # ------------------------------------------------------------------ the watch

    def watch(self, on_notice: Callable[[list], None], stop: threading.Event) -> None:
        """check() until `stop` is set, calling `on_notice` whenever the notices change (first
        with the ones found, if any). GCE hangs on the preemption flag between rounds; EC2 is
        polled every `poll_seconds`."""
        last: list = []
        silent = False
        while not stop.is_set():
            try:
                found = self.check(hang=self.source == "gce" and bool(self._etags))
            except Unanswered as error:
                if not silent:
                    log.warning("the %s metadata service does not answer (%s); trying again",
                                self.source, error)  # fmt: skip
                silent = True
                stop.wait(self.poll_seconds)
                continue
            if silent:
                log.info("the %s metadata service answers again", self.source)
                silent = False
            if found != last:
                last = found
                on_notice(found)
            if self.source == "ec2":
                stop.wait(self.poll_seconds)


def _json(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None
