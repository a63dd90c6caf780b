"""The cloud's own notices about this machine, read from its instance metadata service: a spot
reclaim, a scheduled maintenance, a rebalance recommendation, each as a plain dict

    {"kind": "reclaim" | "maintenance" | "rebalance", "source": "ec2" | "gce",
     "action": the cloud's own word, "deadline": "2026-01-02T03:04:05Z" or None,
     "detail": one line for a person}

most urgent first (reclaim, then maintenance, then rebalance; the earliest deadline first).

EC2 (IMDSv2; https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html):
a session token from PUT /latest/api/token (X-aws-ec2-metadata-token-ttl-seconds), sent back as
X-aws-ec2-metadata-token on every GET and fetched again when IMDS answers 401 (expired):
  /latest/meta-data/spot/instance-action                {"action": "terminate" | "stop" |
      "hibernate", "time": "2017-09-18T08:22:00Z"}: reclaim, the deadline its time; 404: none
      (spot-instance-termination-notices.html, which asks for a check every 5 seconds)
  /latest/meta-data/events/recommendations/rebalance    {"noticeTime": ...}: rebalance, no
      deadline (it is a hint that a reclaim is more likely, not a date); 404: none
  /latest/meta-data/events/maintenance/scheduled        [{"Code": "system-reboot", "NotBefore":
      "21 Jan 2019 09:00:43 GMT", "State": "active", ...}]: a maintenance per active event, the
      deadline its NotBefore; completed and canceled events stay listed and are left out
GCE (https://cloud.google.com/compute/docs/metadata/getting-live-migration-notice), with
Metadata-Flavor: Google:
  /computeMetadata/v1/instance/preempted          TRUE: reclaim, deadline 30 s after it was
      first seen (a spot or preemptible VM's notice; the value carries no time); FALSE: none
  /computeMetadata/v1/instance/maintenance-event  TERMINATE_ON_HOST_MAINTENANCE (a GPU VM, which
      cannot live-migrate, is stopped: about an hour's notice) or MIGRATE_ON_HOST_MAINTENANCE:
      a maintenance, no deadline (the value carries none); NONE: none
A maintenance whose action is TERMINATE_ON_HOST_MAINTENANCE ends the VM like a reclaim, and
the control plane treats it as one; it keeps kind "maintenance" so the cloud's word survives.

`watch` polls every `poll_seconds` (EC2), or hangs on preempted (`wait_for_change=true`,
`last_etag`, `timeout_sec=poll_seconds`) so that a preemption is seen as it happens and
maintenance-event is read after each hang (GCE). Metadata that cannot be reached, times out,
answers 5xx or an unreadable body is logged once (and once more when it recovers) and asked
again next round; what its endpoint said last still counts meanwhile. Nothing is raised: a
machine without metadata just has no notices. Proxies are never used (the service is
link-local), no request waits more than HTTP_TIMEOUT beyond its hang, and the token is never
logged.
"""

from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SOURCES = ("ec2", "gce", "none")
DEFAULT_BASE = {"ec2": "http://169.254.169.254", "gce": "http://169.254.169.254"}
HTTP_TIMEOUT = 2.0  # seconds for one request (on GCE: beyond the hang it asks for)
MAX_BODY = 64 * 1024
TOKEN_TTL = 21600  # seconds: the longest IMDSv2 allows
# A GCE maintenance that stops the machine (GPU machines cannot live-migrate) ends the work as
# surely as a reclaim.
STOPPING_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"
GCE_RECLAIM_NOTICE = 30.0  # seconds between preempted=TRUE and the VM's stop
UTC = datetime.timezone.utc  # noqa: UP017 (datetime.UTC is Python 3.11+)
KIND_ORDER = {"reclaim": 0, "maintenance": 1, "rebalance": 2}

EC2_TOKEN = "/latest/api/token"
EC2_INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
EC2_REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
EC2_SCHEDULED = "/latest/meta-data/events/maintenance/scheduled"
GCE_PREEMPTED = "/computeMetadata/v1/instance/preempted"
GCE_MAINTENANCE = "/computeMetadata/v1/instance/maintenance-event"
_GCE_WORD = re.compile(r"[A-Z][A-Z_]{0,63}\Z")  # maintenance-event's values look like this

Notice = dict  # {"kind", "source", "action", "deadline", "detail"}: see the module docstring


class _Unreadable(Exception):
    """The metadata said nothing usable this time: unreachable, a timeout, 5xx, a bad body."""


def _iso(moment: datetime.datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso_after(seconds: float) -> str:
    return _iso(datetime.datetime.now(UTC) + datetime.timedelta(seconds=seconds))


def _parse_time(value: Any) -> str | None:
    """EC2's "2017-09-18T08:22:00Z" or "21 Jan 2019 09:00:43 GMT" as ISO-8601 UTC; None when
    it is neither."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:  # fromisoformat reads no "Z" before 3.11
        return _iso(datetime.datetime.fromisoformat(re.sub(r"[Zz]\Z", "+00:00", text)))
    except ValueError:
        pass
    try:
        return _iso(email.utils.parsedate_to_datetime(text))
    except (TypeError, ValueError, IndexError):  # TypeError: Python < 3.10's "cannot parse"
        return None


def _word(value: Any) -> str | None:
    """A cloud's short word (an action, an event code), or None."""
    if isinstance(value, str) and 0 < len(value.strip()) <= 64:
        return value.strip()
    return None


def _notice(kind: str, source: str, action: str, deadline: str | None, detail: str) -> Notice:
    return {"kind": kind, "source": source, "action": action, "deadline": deadline,
            "detail": detail[:200]}  # fmt: skip


def _urgency(notice: Notice) -> tuple:
    return (KIND_ORDER[notice["kind"]], notice["deadline"] is None, notice["deadline"] or "")


def _identity(notices: list[Notice]) -> list[tuple]:
    return [(n["kind"], n["source"], n["action"], n["deadline"]) for n in notices]


def _base_url(source: str, base_url: str | None) -> str:
    url = (base_url or DEFAULT_BASE.get(source, "")).rstrip("/")
    if source != "none" and not url.startswith(("http://", "https://")):
        raise ValueError(f"metadata URL must be http:// or https://, not {url!r}")
    return url


class NoticeWatcher:
    """The notices of `source` ("ec2", "gce" or "none": never any) from its metadata service at
    `base_url` (default: the cloud's link-local address). One thread at a time."""

    def __init__(self, source: str, base_url: str | None = None, poll_seconds: float = 5.0):
        if source not in SOURCES:
            raise ValueError(f"notice source must be one of {', '.join(SOURCES)}, not {source!r}")
        self.source = source
        self.base_url = _base_url(source, base_url)
        self.poll_seconds = max(float(poll_seconds), 0.01)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._said: dict[str, list[Notice]] = {}  # endpoint -> its notices, as it said last
        self._failing: set[str] = set()  # endpoints whose failure is logged
        self._token: str | None = None
        self._token_at = 0.0
        self._etags: dict[str, str] = {}
        self._preempted_at: str | None = None  # the deadline, fixed when TRUE was first seen

    # ------------------------------------------------------------------ the public rounds

    def check(self) -> list[Notice]:
        """One round: the notices present now, most urgent first."""
        if self.source == "ec2":
            self._read(EC2_TOKEN, self._ensure_token)
            if self._token is not None:
                self._read(EC2_INSTANCE_ACTION, self._ec2_instance_action)
                self._read(EC2_REBALANCE, self._ec2_rebalance)
                self._read(EC2_SCHEDULED, self._ec2_scheduled)
        elif self.source == "gce":
            self._read(GCE_PREEMPTED, lambda: self._gce_preempted(hang=False))
            self._read(GCE_MAINTENANCE, self._gce_maintenance)
        return self.notices()

    def notices(self) -> list[Notice]:
        """What every endpoint said last, most urgent first (no request)."""
        found = [dict(notice) for said in self._said.values() for notice in said]
        return sorted(found, key=_urgency)

    def watch(self, on_notice: Callable[[list[Notice]], None], stop: threading.Event) -> None:
        """check() until `stop` is set, calling `on_notice(notices)` whenever the set of notices
        changes (and not for the first, empty one). On GCE each round hangs on preempted for up
        to poll_seconds, so `stop` is seen within one hang (plus HTTP_TIMEOUT). What on_notice
        raises is logged, and it is called again next round."""
        told: list[tuple] = []
        while not stop.is_set():
            started = time.monotonic()
            at_once = False
            if self.source == "gce":
                at_once = self._read(GCE_PREEMPTED, lambda: self._gce_preempted(hang=True))
                self._read(GCE_MAINTENANCE, self._gce_maintenance)
                notices = self.notices()
            else:
                notices = self.check()
            if _identity(notices) != told:
                try:
                    on_notice(notices)
                    told = _identity(notices)
                except Exception:
                    log.exception("the notice handler failed; it is called again next round")
            if not at_once:  # a poll, or a hang cut short (an error, a server that does not hang)
                stop.wait(max(0.0, self.poll_seconds - (time.monotonic() - started)))

    # ------------------------------------------------------------------ requests

    def _read(self, endpoint: str, reader: Callable[[], Any]) -> Any:
        """`reader()` for `endpoint`, its failure logged once; None when it failed."""
        try:
            result = reader()
        except _Unreadable as error:
            if endpoint not in self._failing:
                self._failing.add(endpoint)
                log.warning("%s metadata %s: %s (asked again every round)", self.source,
                            endpoint, error)  # fmt: skip
            return None
        if endpoint in self._failing:
            self._failing.discard(endpoint)
            log.info("%s metadata %s answers again", self.source, endpoint)
        return result

    def _request(
        self, path: str, headers: dict, method: str = "GET", timeout: float | None = None
    ) -> tuple[int, str, Any]:
        """(status, body, headers) of one request; 2xx and 4xx are answers, the rest _Unreadable."""
        request = urllib.request.Request(self.base_url + path, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=timeout or HTTP_TIMEOUT) as answer:
                return answer.status, _body(answer), answer.headers
        except urllib.error.HTTPError as error:
            if error.code >= 500:
                raise _Unreadable(f"HTTP {error.code}") from None
            try:
                return error.code, _body(error), error.headers
            finally:
                error.close()
        except (OSError, ValueError, http.client.HTTPException) as error:  # refused, timed out
            raise _Unreadable(getattr(error, "reason", None) or error) from None

    # ------------------------------------------------------------------ EC2

    def _ensure_token(self) -> None:
        if self._token is not None and time.monotonic() - self._token_at < TOKEN_TTL - 60:
            return
        self._token = None
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}
        status, body, _ = self._request(EC2_TOKEN, headers, method="PUT")
        if status != 200 or not body.strip():
            raise _Unreadable(f"no IMDSv2 token (HTTP {status})")  # the body is not logged
        self._token, self._token_at = body.strip(), time.monotonic()

    def _ec2_get(self, path: str) -> tuple[int, str]:
        """GET with the session token; a 401 (expired) fetches a new one and asks again."""
        for _ in range(2):
            self._ensure_token()
            status, body, _ = self._request(path, {"X-aws-ec2-metadata-token": self._token or ""})
            if status != 401:
                break
            self._token = None
        if status not in (200, 404):
            raise _Unreadable(f"HTTP {status}")
        return status, body

    def _ec2_json(self, path: str) -> Any:
        status, body = self._ec2_get(path)
        if status == 404:
            return None
        try:
            return json.loads(body) if body.strip() else None
        except ValueError:
            raise _Unreadable(f"not JSON: {body[:80]!r}") from None

    def _ec2_instance_action(self) -> None:
        answer = self._ec2_json(EC2_INSTANCE_ACTION)
        if answer is None:
            self._said[EC2_INSTANCE_ACTION] = []
            return
        action = _word(answer.get("action")) if isinstance(answer, dict) else None
        if action is None:
            raise _Unreadable(f"no action in {str(answer)[:80]!r}")
        deadline = _parse_time(answer.get("time"))
        detail = f"EC2 spot instance-action: {action} at {deadline or 'an unknown time'}"
        self._said[EC2_INSTANCE_ACTION] = [_notice("reclaim", "ec2", action, deadline, detail)]

    def _ec2_rebalance(self) -> None:
        answer = self._ec2_json(EC2_REBALANCE)
        if answer is None:
            self._said[EC2_REBALANCE] = []
            return
        if not isinstance(answer, dict):
            raise _Unreadable(f"not an object: {str(answer)[:80]!r}")
        issued = _parse_time(answer.get("noticeTime")) or "an unknown time"
        detail = f"EC2 rebalance recommendation issued at {issued}"
        self._said[EC2_REBALANCE] = [_notice("rebalance", "ec2", "rebalance", None, detail)]

    def _ec2_scheduled(self) -> None:
        events = self._ec2_json(EC2_SCHEDULED)
        if events is None:
            events = []
        if not isinstance(events, list):
            raise _Unreadable(f"not a list: {str(events)[:80]!r}")
        found = []
        for event in events:
            code = _word(event.get("Code")) if isinstance(event, dict) else None
            if code is None or str(event.get("State", "")).lower() != "active":
                continue  # completed and canceled events stay listed for a while
            deadline = _parse_time(event.get("NotBefore"))
            about = str(event.get("Description") or "scheduled event")[:80]
            detail = f"EC2 scheduled {code} ({about}) not before {deadline or 'an unknown time'}"
            found.append(_notice("maintenance", "ec2", code, deadline, detail))
        self._said[EC2_SCHEDULED] = found

    # ------------------------------------------------------------------ GCE

    def _gce_get(self, path: str, hang: bool) -> tuple[str, bool]:
        """(the value at `path`, whether it was a hanging get): with `hang` and an ETag read
        before, the answer comes once the value differs from it, or after poll_seconds."""
        query, timeout = "", HTTP_TIMEOUT
        hang = hang and path in self._etags
        if hang:
            seconds = max(1, int(self.poll_seconds))
            query = "?" + urllib.parse.urlencode(
                {"wait_for_change": "true", "timeout_sec": seconds, "last_etag": self._etags[path]}
            )
            timeout += seconds
        status, body, headers = self._request(path + query, {"Metadata-Flavor": "Google"},
                                              timeout=timeout)  # fmt: skip
        if status != 200:
            raise _Unreadable(f"HTTP {status}")
        etag = headers.get("ETag") if headers is not None else None
        if etag:
            self._etags[path] = etag
        return body.strip(), hang

    def _gce_preempted(self, hang: bool) -> bool:
        """Read preempted; True when the next hang may follow at once: the value changed, or
        this read was the plain one that gave the first ETag."""
        value, hung = self._gce_get(GCE_PREEMPTED, hang)
        value = value.upper()
        if value not in ("TRUE", "FALSE"):
            raise _Unreadable(f"neither TRUE nor FALSE: {value[:80]!r}")
        before = self._said.get(GCE_PREEMPTED)
        if value == "FALSE":
            self._preempted_at = None
            self._said[GCE_PREEMPTED] = []
        else:
            self._preempted_at = self._preempted_at or _iso_after(GCE_RECLAIM_NOTICE)
            detail = f"GCE preempted: the VM stops by {self._preempted_at}"
            notice = _notice("reclaim", "gce", "preempted", self._preempted_at, detail)
            self._said[GCE_PREEMPTED] = [notice]
        changed = before is not None and before != self._said[GCE_PREEMPTED]
        return changed or (not hung and GCE_PREEMPTED in self._etags)

    def _gce_maintenance(self) -> None:
        value, _ = self._gce_get(GCE_MAINTENANCE, hang=False)
        if value == "NONE":
            self._said[GCE_MAINTENANCE] = []
            return
        if not _GCE_WORD.match(value):
            raise _Unreadable(f"not a maintenance event: {value[:80]!r}")
        if value == STOPPING_MAINTENANCE:
            detail = "GCE host maintenance: the VM will be stopped (GPU VMs cannot live-migrate)"
        else:
            detail = f"GCE host maintenance: {value}"
        self._said[GCE_MAINTENANCE] = [_notice("maintenance", "gce", value, None, detail)]


def _body(answer: Any) -> str:
    return answer.read(MAX_BODY).decode("utf-8", "replace")


def ends_the_machine(notice: dict | None) -> bool:
    """Whether a notice says the cloud takes the machine away: the agent's reading of what
    the control plane reads as NodeNotice.ends_the_machine (gpuprov/models.py), which the
    agent, standard library only, cannot import."""
    return notice is not None and (
        notice.get("kind") == "reclaim" or notice.get("action") == STOPPING_MAINTENANCE
    )
