"""A real browser for the dashboard's tests: Debian's headless Chromium, driven by Selenium
through the chromedriver of the same Chromium build (`make test` installs both, like sshd and
nginx). Without them the tests fail with a message, never skip. Selenium is told to stay
offline: it never downloads a driver or a browser.

`chromium()` yields a WebDriver at a laptop's screen size (1366x768) and quits the browser and
its driver when the block exits, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
LAPTOP = (1366, 768)


@contextlib.contextmanager
def chromium() -> Iterator[WebDriver]:
    for binary, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is missing: `make test` installs Debian's {package}")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: no download, ever
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # the suite runs as root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={LAPTOP[0]},{LAPTOP[1]}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()


def fits_the_screen(driver: WebDriver) -> bool:
    """The page needs no sideways scrolling at the window's width (wide tables scroll inside
    their own box)."""
    return bool(
        driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1"
        )
    )
