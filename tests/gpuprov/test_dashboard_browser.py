"""The dashboard in a real browser (headless Chromium through Selenium: tests/browser.py)
against a real dev server, a real worker on the fake cloud whose cheapest region is sold out,
nodes running the simulated agent, a real database and the API served by uvicorn on loopback.

One job's story, page by page: a wrong key gets the sign-in page; a member signs in; a job
submitted through the API appears in the list; its page shows the failover (the sold-out
attempt with its ErrorKind and the cloud's words, then the one that succeeded), its nodes'
liveness and GPU health, and its logs arriving while it runs without a reload; a viewer of
the team sees no button and the route refuses the viewer's own form anyway; another team's
member is refused the page; an admin drains and undrains a worker and reads the spend against
budgets; the member cancels the job from the keyboard, and nothing is left on the cloud.
Every page fits a laptop's screen. With GPUPROV_SCREENSHOTS=<dir> the screenshots of each page
are written there (docs/images holds the ones the docs show).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait
from temporalio.client import Client

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import JobsSettings, WorkersSettings
from gpuprov.engine.worker import open_records
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import CostRecord, utcnow
from gpuprov.store.records import Records
from gpuprov.store.teams import Teams
from providers.errors import ErrorKind
from providers.fake.config import FaultRule
from tests.browser import LAPTOP, chromium, fits_the_screen
from tests.helpers import assert_nothing_left, eventually, fake_worker, fast_cloud

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

FAST = WorkersSettings(heartbeat_interval_seconds=0.3, lost_after_seconds=5)
JOBS = JobsSettings(stop_grace_seconds=3)
SOLD_OUT = "no H100 capacity left in r1 (injected by the test)"
WAIT = 90  # seconds a page may take to show what a step waits for
TEMPORAL_UI = "http://127.0.0.1:8233"
# A check may find an element of the page being replaced: it is read again, not failed on.
NOT_YET = (NoSuchElementException, StaleElementReferenceException)


class Browser:
    """The driver's calls, each in a thread: the API and the worker share this event loop."""

    def __init__(self, driver: WebDriver, url: str, shots: Path) -> None:
        self.driver = driver
        self.url = url
        self.shots = shots

    async def do(self, step: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(step, self.driver, *args)

    async def open(self, path: str) -> None:
        await self.do(lambda driver: driver.get(self.url + path))
        assert await self.do(fits_the_screen), f"{path} needs sideways scrolling"

    async def text(self, element_id: str) -> str:
        return await self.do(lambda driver: driver.find_element(By.ID, element_id).text)

    async def has(self, css: str) -> bool:
        return bool(await self.do(lambda driver: driver.find_elements(By.CSS_SELECTOR, css)))

    async def until(self, check: Callable[[WebDriver], Any], what: str) -> Any:
        wait = WebDriverWait(self.driver, WAIT, poll_frequency=0.25, ignored_exceptions=NOT_YET)
        return await self.do(lambda _: wait.until(check, f"waited {WAIT}s for {what}"))

    async def reload_until(self, path: str, check: Callable[[WebDriver], Any], what: str) -> Any:
        async def reloaded() -> Any:
            await self.open(path)
            try:
                return await self.do(check)
            except NOT_YET:
                return None

        return await eventually(reloaded, what, timeout=WAIT, interval=0.5)

    async def submit(self, css: str) -> None:
        """Click the button at `css` and wait until the page it posts to has replaced this one
        (the same address when the form answers with a redirect back)."""

        def click(driver: WebDriver) -> None:
            before = driver.find_element(By.TAG_NAME, "html")
            driver.find_element(By.CSS_SELECTOR, css).click()
            WebDriverWait(driver, WAIT).until(
                expected_conditions.staleness_of(before), f"waited {WAIT}s for {css}'s answer"
            )

        await self.do(click)

    async def screenshot(self, name: str) -> None:
        def shoot(driver: WebDriver) -> None:
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(LAPTOP[0], min(max(LAPTOP[1], height + 140), 2200))
            driver.save_screenshot(str(self.shots / f"dashboard-{name}.png"))
            driver.set_window_size(*LAPTOP)

        await self.do(shoot)

    async def sign_in(self, key: str) -> None:
        await self.open("/ui/")
        await self.until(lambda d: d.current_url.endswith("/ui/login"), "the sign-in page")

        def type_key(driver: WebDriver) -> None:
            field = driver.find_element(By.ID, "key")
            field.clear()
            field.send_keys(key, Keys.ENTER)

        await self.do(type_key)

    async def sign_out(self) -> None:
        await self.do(
            lambda d: d.find_element(By.CSS_SELECTOR, "form[action='/ui/logout'] button").click()
        )
        await self.until(lambda d: d.current_url.endswith("/ui/login"), "signed out")


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


@pytest.fixture
def keys(sqlite_records: Records) -> dict[str, str]:
    teams = Teams(sqlite_records.db)
    teams.create("ml", monthly_budget_usd=100.0)
    teams.create("cv", monthly_budget_usd=50.0, max_gpus=16)
    credentials = Credentials(sqlite_records.db)
    return {
        "admin": credentials.create_operator_key("ops")[1],
        "member": credentials.create_operator_key("alice", role="member", team="ml")[1],
        "viewer": credentials.create_operator_key("bob", role="viewer", team="ml")[1],
        "other": credentials.create_operator_key("carol", role="member", team="cv")[1],
    }


def spent_earlier(records: Records, team: str, job: str, provider: str, amount: float) -> None:
    """An earlier run's machine of `team`, gone, that cost `amount` USD: the spend chart's."""
    run = f"{abs(hash((team, job))) % 0xFFFFFF:06x}"
    Teams(records.db).admit_run(job, run, team, 8)
    with records.db.session() as session:
        session.add(
            CostRecord(job=job, run=run, kind="actual", amount=amount, currency="USD",
                       unit="total", source="planted by the test", recorded_at=utcnow(),
                       provider=provider, vm=f"{job}-a1-n0-{run}")
        )  # fmt: skip
        session.commit()


def attempt_rows(driver: WebDriver) -> list[str]:
    return [row.text for row in driver.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")]


def tab_to(driver: WebDriver, element_id: str, limit: int = 80) -> bool:
    """Press Tab from the top of the page until `element_id` has the focus."""
    driver.execute_script("document.activeElement && document.activeElement.blur()")
    for _ in range(limit):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        if driver.execute_script("return document.activeElement.id") == element_id:
            return True
    return False


CANCEL_WITH_OWN_FORM = """
const done = arguments[arguments.length - 1];
const csrf = document.querySelector("input[name=csrf]").value;
fetch(location.pathname + "/cancel", {method: "POST", body: new URLSearchParams({csrf})})
  .then(answer => done(answer.status), () => done(-1));
"""


async def test_the_dashboard_in_a_browser_from_sign_in_to_a_keyboard_cancel(
    client: Client,
    task_queue: str,
    job_name: str,
    sqlite_records: Records,
    keys: dict[str, str],
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shots = Path(os.environ.get("GPUPROV_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    spent_earlier(sqlite_records, "ml", "sweep-lr", "lambda", 42.0)
    spent_earlier(sqlite_records, "cv", "detector", "runpod", 61.5)
    sold_out = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, message=SOLD_OUT, region="r1")
    config = fast_cloud([sold_out], agent="simulated", boot_timeout=60)
    app = create_app(
        sqlite_records,
        workers=FAST,
        jobs=JOBS,
        temporal=client,
        task_queue=task_queue,
        temporal_ui_url=TEMPORAL_UI,
    )
    spec = {
        "name": job_name,
        "team": "ml",
        "nodes": 2,
        "resources": {"gpu": "H100", "gpus_per_node": 8},
        "provisioning_timeout_seconds": 120,
        "run": 'for i in $(seq 1 600); do echo "step $i loss 0.$((600 - i))"; sleep 0.5; done',
    }
    worker = fake_worker(client, task_queue, config, sqlite_records, api_url=url)
    async with (
        serving(app, "127.0.0.1", port),
        worker as (_, cloud),
        httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {keys['member']}"}
        ) as api,
    ):
        with chromium() as driver:
            browser = Browser(driver, url, shots)

            # A wrong key gets the sign-in page again, saying so.
            await browser.sign_in("gpo_" + "0" * 40)
            await browser.until(lambda d: d.find_elements(By.ID, "signin-error"), "the refusal")
            assert "unknown or revoked" in await browser.text("signin-error")
            assert driver.current_url.endswith("/ui/login")
            await browser.screenshot("sign-in")

            # A member signs in; the job submitted through the API appears in the list.
            await browser.sign_in(keys["member"])
            await browser.until(lambda d: d.current_url.endswith("/ui/"), "the jobs page")
            assert "alice · member of ml" in await browser.text("who")
            submitted = await api.post("/v1/jobs", json=spec)
            assert submitted.status_code == 201, submitted.text
            row = f'tr[data-job="{job_name}"]'
            await browser.reload_until(
                "/ui/", lambda d: d.find_elements(By.CSS_SELECTOR, row), "the job in the list"
            )

            # Its page shows the failover and, once it runs, its nodes and live logs.
            page = f"/ui/jobs/{job_name}"
            await browser.reload_until(
                page,
                lambda d: (
                    d.find_element(By.ID, "job-state").text == "running"
                    and "alive" in d.find_element(By.ID, "nodes").text
                ),
                "the job running on live nodes",
            )
            attempts = await browser.do(attempt_rows)
            assert "Capacity" in attempts[0] and SOLD_OUT in attempts[0], attempts
            assert "r1" in attempts[0] and "failed" in attempts[0]
            assert "succeeded" in attempts[-1] and "r2" in attempts[-1], attempts
            nodes = await browser.text("nodes")
            assert nodes.count("alive") == 2 and "healthy" in nodes, nodes
            assert keys["member"] not in await browser.do(lambda d: d.page_source)
            assert await browser.has("#release") and await browser.has("#cancel")
            assert (
                await browser.do(
                    lambda d: d.find_element(By.ID, "temporal-link").get_attribute("href")
                )
                == f"{TEMPORAL_UI}/namespaces/default/workflows/job-{job_name}"
            )

            first = await browser.until(
                lambda d: (
                    "step 2 " in d.find_element(By.ID, "logs").text
                    and d.find_element(By.ID, "logs").text
                ),
                "the first lines of output",
            )
            seen = max(int(line.split()[2]) for line in first.splitlines() if " step " in line)
            await browser.do(lambda d: d.execute_script("window.notReloaded = true"))
            later = f"step {seen + 4} "
            await browser.until(
                lambda d: later in d.find_element(By.ID, "logs").text, f"{later!r} arriving"
            )
            assert await browser.do(lambda d: d.execute_script("return window.notReloaded"))
            await browser.screenshot("job")
            await browser.open("/ui/")
            await browser.screenshot("jobs")

            # A viewer of the team sees no button, and the route refuses the viewer's form.
            await browser.sign_out()
            await browser.sign_in(keys["viewer"])
            await browser.until(lambda d: d.current_url.endswith("/ui/"), "the viewer's list")
            await browser.open(page)
            assert not await browser.has("#release") and not await browser.has("#cancel")
            refused = await browser.do(lambda d: d.execute_async_script(CANCEL_WITH_OWN_FORM))
            assert refused == 403
            assert (await api.get(f"/v1/jobs/{job_name}")).json()["state"] == "running"

            # Another team's member is refused the page, naming the team.
            await browser.sign_out()
            await browser.sign_in(keys["other"])
            await browser.until(lambda d: d.current_url.endswith("/ui/"), "cv's list")
            assert not await browser.has(row)
            await browser.open(page)
            assert "team 'ml'" in await browser.text("error-detail")

            # An admin drains and undrains one of the job's workers, and reads the spend.
            await browser.sign_out()
            await browser.sign_in(keys["admin"])
            await browser.until(lambda d: d.current_url.endswith("/ui/"), "the admin's list")
            await browser.open("/ui/workers")
            workers = await browser.do(
                lambda d: d.find_elements(By.CSS_SELECTOR, "#workers tbody tr[data-worker]")
            )
            assert len(workers) == 2
            worker_id = await browser.do(lambda d: workers[0].get_attribute("data-worker"))
            drain = f'tr[data-worker="{worker_id}"] button'
            await browser.submit(drain)
            await browser.until(
                lambda d: d.find_element(By.CSS_SELECTOR, drain).text == "Undrain", "drained"
            )
            assert sqlite_records.get_worker(worker_id).draining
            await browser.screenshot("workers")
            await browser.submit(drain)
            await browser.until(
                lambda d: d.find_element(By.CSS_SELECTOR, drain).text == "Drain", "undrained"
            )
            await browser.open("/ui/spend")
            teams = await browser.text("teams")
            assert "ml" in teams and "cv" in teams and "100.00" in teams and "61.50" in teams
            assert await browser.has("#teams-chart-title") and await browser.has("rect.bar.over")
            assert "lambda" in await browser.text("providers")
            await browser.screenshot("spend")

            # The member cancels it from the keyboard; every machine is given back.
            await browser.sign_out()
            await browser.sign_in(keys["member"])
            await browser.until(lambda d: d.current_url.endswith("/ui/"), "the member's list")
            await browser.open(page)
            assert await browser.do(tab_to, "cancel"), "the Cancel button is not reachable by Tab"
            await browser.do(lambda d: ActionChains(d).send_keys(Keys.ENTER).perform())
            await browser.until(lambda d: d.find_elements(By.ID, "done"), "the cancel's notice")
            assert "Cancel requested" in await browser.text("done")

            async def ended() -> dict | None:
                status = (await api.get(f"/v1/jobs/{job_name}")).json()
                return status if status.get("state") in ("cancelled", "failed") else None

            final = await eventually(ended, "the job cancelled", timeout=WAIT)
            assert final["state"] == "cancelled", final
            await browser.reload_until(
                page,
                lambda d: d.find_element(By.ID, "job-state").text == "cancelled",
                "the page showing it cancelled",
            )
            assert not await browser.has("#cancel")
        await eventually(lambda: not cloud.live_instances(), "every machine gone", timeout=WAIT)
        assert_nothing_left(cloud)
