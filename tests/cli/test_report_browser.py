"""The report in a real browser: headless Chromium from the distribution's packages, driven by
Selenium. The page loads from file:// with no console error and fetches nothing; the blocked
sessions come first, each with the resolve command the library gives; and no hostile string
from a log ran (no script, no image, no dialog, the marker global never set)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from report_helpers import blocked_root, hostile_session

from walj.cli import main
from walj.cli._common import printable
from walj.cli._inspect import resolve_command

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = ("the browser test needs Chromium and its driver from the distribution's packages "
           "(Debian: apt-get install -y chromium chromium-driver) and Selenium "
           "(pip install -e '.[test]')")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,1000")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium for the module, with a fresh profile; never a driver download."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip(f"no {CHROMIUM} or {CHROMEDRIVER}: {INSTALL}")
    webdriver = pytest.importorskip("selenium.webdriver", reason=INSTALL)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not fetch anything
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _blockers(path: Path) -> list[Any]:
    from walj.journal.state import rebuild
    from walj.log.scan import LogScan

    return list(rebuild(LogScan(str(path), mode="salvage")).snapshot().blockers)


def test_the_report_in_a_browser(browser: Any, tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    root = tmp_path / "root"
    blocked_root(root)
    hostile, _ = hostile_session(root)
    out = tmp_path / "report.html"
    assert main(["report", str(root), "-o", str(out), "--jobs", "1"]) == 1
    browser.get(out.as_uri())
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("walj report")
    errors = [entry for entry in browser.get_log("browser")
              if entry["level"] in ("SEVERE", "WARNING")]
    assert errors == []  # a blocked script or image would be a CSP error here
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert browser.execute_script("return typeof window.__walj_pwned") == "undefined"
    assert browser.execute_script(
        "return [document.scripts.length, document.images.length, "
        "performance.getEntriesByType('resource').length]") == [0, 0, 0]

    rows = browser.find_elements(By.CSS_SELECTOR, "table.sessions tbody tr")
    statuses = [row.find_element(By.CSS_SELECTOR, "td").text for row in rows]
    assert statuses == ["BLOCKED"] * 3 + ["CORRUPT", "ACTIVE"]
    sections = browser.find_elements(By.CSS_SELECTOR, "section.session")
    assert [s.get_attribute("data-status") for s in sections][:3] == ["blocked"] * 3
    first = sections[0].find_element(By.CSS_SELECTOR, "h2 span.mono").text
    assert first == printable(hostile.name)  # the most recent blocked session first
    shown = [pre.text for pre in browser.find_elements(By.CSS_SELECTOR, "pre.command")]
    expected = [printable(resolve_command(str(root / name), b))
                for name in (hostile.name, "turn", "blocked") for b in _blockers(root / name)]
    assert sorted(shown) == sorted(expected) and len(shown) == 3
    assert shown[0] == expected[0]
