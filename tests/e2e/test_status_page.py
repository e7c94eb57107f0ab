"""The status page (/ui) in real headless Chromium (Debian's chromium, driven by Selenium
through Debian's chromedriver; scripts/install-system.sh installs both) against the real
embedded runtime (issue 13): sign in with the token, see the local endpoint online, submit
a batch from the SDK and watch the page reach SUCCEEDED without a reload (live over the
WebSocket API); bad tokens get the sign-in page and never any data. Screenshots are kept
in tests/artifacts/ui/ (or $SKYFN_TEST_ARTIFACTS/ui)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import requests

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("SKYFN_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts")) / "ui"


def nap(x):
    import time as _t

    _t.sleep(0.3)
    return x + 1


@pytest.fixture
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("chromium and chromedriver are needed: run scripts/install-system.sh (apt-get install chromium "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="skyfn-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver, predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(predicate)
        if value:
            return value
        time.sleep(0.2)
    driver.save_screenshot(str(ARTIFACTS / f"timeout-{what}.png"))
    raise AssertionError(f"the page did not show {what} within {timeout:.0f} s")


def sign_in(driver, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/ui")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "signin-button").click()


def test_page_follows_a_batch_live(browser, client, endpoint_id):
    from skyfn import Executor

    url = client.service_url
    sign_in(browser, url, client.config.token)
    wait(browser, "return !document.getElementById('dashboard').hidden", 30, "the dashboard")
    wait(browser, "const r = document.querySelector('#endpoints tr[data-endpoint=\"local\"]');"
                  "return r && r.dataset.status === 'online'", 30, "the local endpoint online")
    wait(browser, "return document.getElementById('live').textContent === 'live'", 30, "the live push")
    browser.save_screenshot(str(ARTIFACTS / "1-signed-in.png"))
    marker = browser.execute_script("window.__skyfnMarker = Math.random(); return window.__skyfnMarker")

    with Executor(endpoint_id=endpoint_id, client=client, push=True) as ex:
        futures = [ex.submit(nap, i) for i in range(12)]
        ids = [None] * len(futures)
        deadline = time.monotonic() + 30
        while any(f.task_id is None for f in futures) and time.monotonic() < deadline:
            time.sleep(0.05)
        ids = [f.task_id for f in futures]
        assert all(ids)
        # the batch appears while it runs, then every row turns SUCCEEDED without a reload
        probe = ("const ids = arguments[0]; return ids.every(id => {"
                 " const r = document.querySelector(`#tasks tr[data-task=\"${id}\"]`); return r && %s; })")
        wait_args(browser, probe % "true", ids, 60, "the batch listed")
        browser.save_screenshot(str(ARTIFACTS / "2-batch-listed.png"))
        assert [f.result(timeout=120) for f in futures] == [i + 1 for i in range(12)]
    # SUCCEEDED from the push, then each row's latency breakdown from the refresh it triggers
    wait_args(browser, probe % "r.dataset.state === 'SUCCEEDED' && r.cells[10].textContent !== ''", ids, 60,
              "the batch SUCCEEDED")
    browser.save_screenshot(str(ARTIFACTS / "3-batch-succeeded.png"))
    assert browser.execute_script("return window.__skyfnMarker") == marker  # the same page: no reload
    assert browser.execute_script("return window.skyfnUi.pushes") > 0  # updated by the WebSocket push
    # the latency breakdown of a finished task: six stage cells and a total, all numbers but
    # 'waiting' (it had no inputs to wait for)
    cells = stage_cells(browser, ids[0])
    assert len(cells) == 7 and cells[1] == "" and all(c and float(c) >= 0 for i, c in enumerate(cells) if i != 1)
    assert float(cells[4]) >= 250  # the 'run' stage of a 0.3 s nap


def stage_cells(driver, task_id: str) -> list[str]:
    """service, waiting, queue, dispatch, run, return, total (ms) of a task's row."""
    return driver.execute_script(
        "return [...document.querySelector(`#tasks tr[data-task=\"${arguments[0]}\"]`).cells].slice(4)"
        ".map(c => c.textContent)", task_id)


def slow(seconds):
    import time as _t

    _t.sleep(seconds)
    return seconds


def test_a_dependent_shows_waiting_then_the_time_it_waited(browser, client, endpoint_id):
    """A task given another's future (issue 26) is listed WAITING, counted as such, while its
    input runs; once done, the time it waited is its 'waiting' stage, not the service's."""
    from skyfn import Executor

    sign_in(browser, client.service_url, client.config.token)
    wait(browser, "return !document.getElementById('dashboard').hidden", 30, "the dashboard")
    with Executor(endpoint_id=endpoint_id, client=client) as ex:
        first = ex.submit(slow, 6.0)
        second = ex.submit(nap, first)
        deadline = time.monotonic() + 30
        while second.task_id is None and time.monotonic() < deadline:
            time.sleep(0.05)
        tid = second.task_id
        assert tid
        wait_args(browser, "const r = document.querySelector(`#tasks tr[data-task=\"${arguments[0]}\"]`);"
                           "const c = document.querySelector('#state-counts span[data-state=\"WAITING\"]');"
                           "return r && r.dataset.state === 'WAITING' && c && Number(c.dataset.count) >= 1",
                  tid, 30, "the dependent WAITING")
        browser.save_screenshot(str(ARTIFACTS / "5-dependent-waiting.png"))
        assert second.result(timeout=120) == 7.0
    wait_args(browser, "const r = document.querySelector(`#tasks tr[data-task=\"${arguments[0]}\"]`);"
                       "return r && r.dataset.state === 'SUCCEEDED' && r.cells[10].textContent !== ''",
              tid, 60, "the dependent SUCCEEDED")
    browser.save_screenshot(str(ARTIFACTS / "6-dependent-succeeded.png"))
    service, waited, *_, total = [float(c) for c in stage_cells(browser, tid)]
    assert 5000 <= waited <= total and service < 1000  # it waited out its input's 6 s run


def test_the_page_consumes_no_result(browser, client, endpoint_id, hot_store):
    """The page's subscription is a peek one (and its refresh reads no result): a batch it
    watched to SUCCEEDED keeps its results unread, for whoever collects them later."""
    sign_in(browser, client.service_url, client.config.token)
    wait(browser, "return document.getElementById('live').textContent === 'live'", 30, "the live push")
    fid = client.register_function(nap)
    batch = client.create_batch(endpoint_id)
    for i in range(8):
        batch.add(fid, i)
    ids = client.batch_run(batch)
    pushes = browser.execute_script("return window.skyfnUi.pushes")
    probe = ("return arguments[0].every(id => { const r = document.querySelector(`#tasks tr[data-task=\"${id}\"]`);"
             " return r && r.dataset.state === 'SUCCEEDED'; })")
    wait_args(browser, probe, ids, 60, "the batch SUCCEEDED")
    assert browser.execute_script("return window.skyfnUi.pushes") > pushes  # pushed to the page
    time.sleep(3.5)  # and one more 3 s refresh
    assert hot_store.consumed(ids) == []
    got = client.get_batch_result(ids)
    assert [got[t]["result"] for t in ids] == [i + 1 for i in range(8)]
    assert hot_store.consumed(ids) == ids


def wait_args(driver, script, arg, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.execute_script(script, arg):
            return
        time.sleep(0.2)
    driver.save_screenshot(str(ARTIFACTS / f"timeout-{what.replace(' ', '-')}.png"))
    raise AssertionError(f"the page did not show {what} within {timeout:.0f} s")


def test_bad_tokens_get_the_sign_in_page_and_no_data(browser, client, endpoint_id, local_home):
    from infra.local import runtime
    from infra.local.state import StateDir

    url = client.service_url
    page = requests.get(f"{url}/ui", timeout=30)
    assert page.status_code == 200 and "Sign in" in page.text
    assert endpoint_id not in page.text and "data-endpoint=" not in page.text and "data-task=" not in page.text
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert requests.get(f"{url}/ui/nothing-here", timeout=30).status_code == 404
    # the same files and answers as the AWS function (tests/unit/test_ui_handler.py); both APIs on this origin
    assert requests.get(f"{url}/ui/config.json", timeout=30).json() == {"api_url": "/", "ws_url": "/ws"}
    for probe in ("/ui/%2e%2e/lambdas/api.py", "/ui/..%2fui.py", "/ui/__init__.py"):
        assert requests.get(f"{url}{probe}", timeout=30).status_code == 404, probe

    expired = runtime.mint_token(StateDir.at(local_home), "alice", ttl_seconds=-3600)
    for n, token in enumerate(("not-a-token", expired, client.config.token[:-4] + "AAAA")):
        sign_in(browser, url, token)
        wait(browser, "return document.getElementById('signin-error').textContent.includes('refused')", 30,
             "the refusal")
        browser.save_screenshot(str(ARTIFACTS / f"4-refused-{n}.png"))
        state = browser.execute_script(
            "return {dash: document.getElementById('dashboard').hidden, signin: document.getElementById('signin').hidden,"
            " rows: document.querySelectorAll('#endpoints tbody tr, #tasks tbody tr').length,"
            " live: document.getElementById('live').textContent, text: document.body.innerText}")
        assert state["dash"] is True and state["signin"] is False and state["rows"] == 0
        assert state["live"] == "offline" and endpoint_id not in state["text"]
