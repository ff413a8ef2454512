"""The admin status page in a real headless Chromium (Debian's chromium and chromium-driver).

The page shows a target that real failing traffic suspended, with a live countdown; its Clear
button closes the scope; the next request reaches that target; the page then shows it healthy.
With ``SIDESTEP_SCREENSHOTS=docs/images`` the test also saves the screenshots the docs show.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import fastapi
import fastapi.responses
import httpx
import pytest
from fastapi.middleware.cors import CORSMiddleware
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import sidestep
import sidestep.admin
from servers import serve_asgi
from test_admin import TOKEN, config_for, suspend_origins
from test_admin_pools import ODD, SPENT, pooled
from upstream import Respond, Upstream

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
pytestmark = pytest.mark.slow


def _browser(profile: Path, *, scripts: bool = True) -> webdriver.Chrome:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(binary):
            pytest.fail(
                f"{binary} is missing: apt-get install chromium chromium-driver", pytrace=False
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1100,560",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    if not scripts:
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2}
        )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    # Every request the page makes carries the token, as behind an authenticating proxy.
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {TOKEN}"}}
    )
    return driver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    driver = _browser(tmp_path / "profile")
    yield driver
    driver.quit()


def _row_of(driver: webdriver.Chrome, target: str) -> str:
    """The class of `target`'s first row on the page ("open", "healthy", ...).

    Read in one script, so a refresh that replaces the rows between two reads can never
    leave the test holding a row that is gone.
    """
    found = driver.execute_script(
        """
        for (const row of document.querySelectorAll("tbody tr")) {
          const cell = row.querySelector("td");
          if (cell && cell.innerText.trim() === arguments[0]) return row.className;
        }
        return "";
        """,
        target,
    )
    return str(found)


def _waiting(driver: webdriver.Chrome, seconds: float) -> WebDriverWait[webdriver.Chrome]:
    """A wait polling often: the page redraws its rows as it refreshes, so a row found just
    before may be stale, and is looked for again."""
    return WebDriverWait(
        driver,
        seconds,
        poll_frequency=0.05,
        ignored_exceptions=(StaleElementReferenceException,),
    )


def _save(driver: webdriver.Chrome, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("SIDESTEP_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(folder / name))


def test_the_page_shows_a_real_suspension_and_its_clear_button_closes_it(
    browser: webdriver.Chrome, a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """Chromium shows the primary open with a countdown that ticks; Clear closes it; the next request reaches the primary; the page shows it healthy."""
    a.behaviour = lambda seen: Respond(503, b"down")
    transport = sidestep.FailoverTransport(config_for(a, b))
    with httpx.Client(transport=transport) as client:
        assert client.post(f"{a.url}/v1/chat", json={}).text == "b"
        app = sidestep.admin.app(transport, token=TOKEN)
        with serve_asgi(app, lifespan="off") as url:
            browser.get(f"{url}/")
            # the page redraws its rows as it refreshes: a row found just before is stale
            wait = _waiting(browser, 10)
            wait.until(lambda d: _row_of(d, "primary") == "open")
            assert wait.until(lambda d: _row_of(d, "backup")) == "healthy"
            first = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "tr.open td.retry").text)
            assert first.endswith("s") and 250 <= int(first[:-1]) <= 300
            wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "tr.open td.retry").text != first)
            _save(browser, "admin-open.png", tmp_path)

            a.behaviour = lambda seen: Respond(200, b"a")

            def click_clear(d: webdriver.Chrome) -> bool:
                button = d.find_element(By.CSS_SELECTOR, "tr.open button.clear")
                assert button.is_enabled()
                button.click()
                return True

            wait.until(click_clear)
            wait.until(lambda d: _row_of(d, "primary") == "healthy")
            assert transport.suspensions() == []
            before = a.calls
            assert client.post(f"{a.url}/v1/chat", json={}).text == "a"
            assert a.calls == before + 1
            browser.refresh()
            wait.until(lambda d: _row_of(d, "primary") == "healthy")
            assert not browser.find_elements(By.CSS_SELECTOR, "tr.open")
            _save(browser, "admin-cleared.png", tmp_path)


def test_the_page_is_readable_with_scripts_off(a: Upstream, b: Upstream, tmp_path: Path) -> None:
    """With JavaScript disabled, Chromium still shows the open primary, and the Clear buttons stay disabled."""
    a.behaviour = lambda seen: Respond(503, b"down")
    transport = sidestep.FailoverTransport(config_for(a, b))
    driver = _browser(tmp_path / "profile", scripts=False)
    try:
        with httpx.Client(transport=transport) as client:
            client.post(f"{a.url}/v1/chat", json={})
        with serve_asgi(sidestep.admin.app(transport, token=TOKEN), lifespan="off") as url:
            driver.get(f"{url}/")
            assert _row_of(driver, "primary") == "open"
            assert _row_of(driver, "backup") == "healthy"
            button = driver.find_element(By.CSS_SELECTOR, "tr.open button.clear")
            assert not button.is_enabled()
            assert "Scripts are off" in driver.find_element(By.TAG_NAME, "body").text
    finally:
        driver.quit()


def test_a_page_of_another_origin_cannot_clear_with_the_operators_cached_credentials(
    a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """In Chromium, where every request carries the operator's credential (as behind an authenticating proxy), to the admin app mounted in FastAPI under a permissive CORSMiddleware(allow_credentials=True), a script on an allowed other origin reads the suspensions cross-origin but its DELETE is refused (403) and the scope stays open; the admin page's own Clear still works."""
    a.behaviour = lambda seen: Respond(503, b"down")
    transport = sidestep.FailoverTransport(config_for(a, b))
    api = fastapi.FastAPI()
    api.add_middleware(
        CORSMiddleware,
        allow_origin_regex=r"http://localhost:\d+",
        allow_credentials=True,
        allow_methods=["*"],
        allow_headers=["*"],
    )
    api.mount("/sidestep", sidestep.admin.app(transport, token=TOKEN))

    @api.get("/frontend")
    def frontend() -> fastapi.responses.HTMLResponse:
        return fastapi.responses.HTMLResponse("<!doctype html><title>frontend</title>")

    driver = _browser(tmp_path / "profile")
    try:
        with httpx.Client(transport=transport) as client, serve_asgi(api, lifespan="off") as url:
            assert client.post(f"{a.url}/v1/chat", json={}).text == "b"
            (row,) = transport.suspensions()
            port = httpx.URL(url).port
            driver.get(f"http://127.0.0.1:{port}/sidestep/")
            WebDriverWait(driver, 10, poll_frequency=0.05).until(
                lambda d: _row_of(d, "primary") == "open"
            )
            # another origin (localhost is not 127.0.0.1) that the host app's CORS allows
            driver.get(f"http://localhost:{port}/frontend")
            script = """
                const done = arguments[arguments.length - 1];
                const at = arguments[0];
                Promise.all([
                  fetch(at + "/sidestep/suspensions", {credentials: "include"}),
                  fetch(at + "/sidestep/suspensions/" + arguments[1],
                        {method: "DELETE", credentials: "include"}),
                ]).then(rs => done(rs.map(r => r.status)), e => done(String(e)));
            """
            statuses = driver.execute_async_script(script, f"http://127.0.0.1:{port}", row.scope_id)
            assert statuses == [
                200,
                403,
            ]  # the credentials did ride along: only the change is refused
            assert [r.scope_id for r in transport.suspensions()] == [row.scope_id]
            # the page itself (same origin, same cached credentials) still clears
            driver.get(f"http://127.0.0.1:{port}/sidestep/")
            wait = _waiting(driver, 10)

            def click_clear(d: webdriver.Chrome) -> bool:
                d.find_element(By.CSS_SELECTOR, "tr.open button.clear").click()
                return True

            wait.until(click_clear)
            wait.until(lambda d: _row_of(d, "primary") == "healthy")
            assert transport.suspensions() == []
    finally:
        driver.quit()


def _class_of(driver: webdriver.Chrome, target: str) -> str:
    """The class of `target`'s first row drawn on the page, "" when none is drawn."""
    return str(
        driver.execute_script(
            "var rows = document.querySelectorAll('tbody tr');"
            "for (var i = 0; i < rows.length; i++) {"
            "  var cell = rows[i].querySelector('td');"
            "  if (cell && cell.textContent === arguments[0]) { return rows[i].className; }"
            "}"
            "return '';",
            target,
        )
    )


def _summary(driver: webdriver.Chrome) -> str:
    return str(driver.find_element(By.ID, "summary").text)


def test_the_page_over_2000_origins_counts_them_draws_what_is_in_view_and_still_clears(
    browser: webdriver.Chrome, a: Upstream, b: Upstream
) -> None:
    """Over 2,000 suspended unrouted origins and a primary that real traffic suspended, Chromium says 2,001 scopes are not healthy, keeps only the rows in view (and a few around them) in its table, draws the last origin once scrolled to the end, and its Clear still closes the primary: the count drops to 2,000, the primary shows healthy, and the next request reaches it."""
    a.behaviour = lambda seen: Respond(503, b"down")
    transport = sidestep.FailoverTransport(config_for(a, b))
    origins = suspend_origins(transport.store, 2_000)
    with httpx.Client(transport=transport) as client:
        assert client.post(f"{a.url}/v1/chat", json={}).text == "b"
        (primary,) = [row for row in transport.suspensions() if row.target == "primary"]
        with serve_asgi(sidestep.admin.app(transport, token=TOKEN), lifespan="off") as url:
            browser.get(f"{url}/")
            wait = _waiting(browser, 20)
            # the HTML says as much (showing the first 100 origins) until the script's first draw
            wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Updated"))
            assert _summary(browser) == "2,001 scopes are not healthy: 2,001 open."
            wait.until(lambda d: _class_of(d, "primary") == "open")
            assert _class_of(browser, "backup") == "healthy"
            drawn = browser.find_elements(By.CSS_SELECTOR, "tbody tr")
            assert 10 < len(drawn) < 100
            assert _class_of(browser, origins[-1]) == ""  # far below: not drawn

            browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")
            wait.until(lambda d: _class_of(d, origins[-1]) == "open")
            assert _class_of(browser, "primary") == ""  # far above now
            assert len(browser.find_elements(By.CSS_SELECTOR, "tbody tr")) < 100
            browser.execute_script("window.scrollTo(0, 0)")
            wait.until(lambda d: _class_of(d, "primary") == "open")

            a.behaviour = lambda seen: Respond(200, b"a")

            def click_clear(d: webdriver.Chrome) -> bool:
                selector = f'tr[data-scope="{primary.scope_id}"] button.clear'
                d.find_element(By.CSS_SELECTOR, selector).click()
                return True

            wait.until(click_clear)
            wait.until(lambda d: _summary(d) == "2,000 scopes are not healthy: 2,000 open.")
            wait.until(lambda d: _class_of(d, "primary") == "healthy")
        assert len(transport.suspensions()) == 2_000
        before = a.calls
        assert client.post(f"{a.url}/v1/chat", json={}).text == "a"
        assert a.calls == before + 1


def _pool_rows(driver: webdriver.Chrome) -> list[list[str]]:
    """The cells' text of each member row of the pools table, read in one script."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll('#pools tr.member'), function (tr) {"
        "  return Array.from(tr.cells, function (td) { return td.textContent; });"
        "});"
    )
    return [list(map(str, row)) for row in found]


def test_the_page_shows_each_pool_member_and_follows_its_counts(
    browser: webdriver.Chrome, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """Chromium shows a pooled route's members — tier, weight, in flight, latency,
    rate-limit room, attempts and share — with a name that is markup shown as text;
    after more requests the page's refresh shows the new counts, under its CSP."""
    b.behaviour = lambda seen: Respond(body="b", headers=dict(SPENT))
    transport = sidestep.FailoverTransport(pooled(a, b, c))
    with httpx.Client(transport=transport) as client:
        for n in range(200):  # at least 12, and until B has answered once (drawn first)
            client.get(f"{b.url}/v1/chat")
            if n >= 11 and b.calls:
                break
        with serve_asgi(sidestep.admin.app(transport, token=TOKEN), lifespan="off") as url:
            browser.get(f"{url}/")
            wait = _waiting(browser, 10)
            wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("Updated"))
            rows = _pool_rows(browser)
            assert [row[0] for row in rows] == ["key-a", "key-b", ODD]
            assert [row[1:4] for row in rows] == [["0", "3", "0"], ["0", "3", "0"], ["1", "1", "0"]]
            assert [row[5] for row in rows] == ["yes", "no", "yes"]
            assert [row[6] for row in rows] == [str(a.calls), str(b.calls), "0"]
            assert rows[0][4].endswith(" ms") and rows[2][4] == "—"
            assert rows[2][7] == "0.0%" and rows[0][7].endswith("%")
            assert not browser.find_elements(By.CSS_SELECTOR, "#pools i")  # text, not markup

            sent = a.calls + b.calls
            for _ in range(8):
                client.get(f"{b.url}/v1/chat")
            assert a.calls + b.calls == sent + 8
            wait.until(
                lambda d: [row[6] for row in _pool_rows(d)] == [str(a.calls), str(b.calls), "0"]
            )


def test_the_pools_are_readable_with_scripts_off(
    a: Upstream, b: Upstream, c: Upstream, tmp_path: Path
) -> None:
    """With JavaScript disabled, Chromium shows the pools table the server wrote."""
    transport = sidestep.FailoverTransport(pooled(a, b, c))
    with httpx.Client(transport=transport) as client:
        client.get(f"{b.url}/v1/chat")
    driver = _browser(tmp_path / "profile", scripts=False)
    try:
        with serve_asgi(sidestep.admin.app(transport, token=TOKEN), lifespan="off") as url:
            driver.get(f"{url}/")
            rows = _pool_rows(driver)
            assert [row[0] for row in rows] == ["key-a", "key-b", ODD]
            assert sum(int(row[6]) for row in rows) == 1
    finally:
        driver.quit()
