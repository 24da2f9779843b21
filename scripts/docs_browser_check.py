"""Load /docs and /redoc of a live posenc in headless chromium with every other host unreachable.

    python scripts/docs_browser_check.py http://127.0.0.1:8000

Needs selenium (>= 4.20) plus Debian's chromium and chromium-driver; no browser or driver is
downloaded (both paths are given, Selenium Manager stays offline). Host names other than the
server's resolve to nothing (`--host-resolver-rules`) and any proxy use is refused, so a page that
needs a CDN, a web font or the Swagger validator shows a failed request. For each page it checks:
the operations are listed (several paths visible in the rendered text), every request the page
made went to the server itself (Chrome DevTools Network events from the performance log), none
failed, none answered >= 400, and the console logged no error. Exit status 0 only if all hold.
scripts/browser-test.sh starts the server and runs this.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# Operation paths each page must show once rendered (tables, inference, operations).
EXPECTED_PATHS = ("/v1/rope", "/v1/alibi/slopes", "/v1/t5/buckets", "/v2/models/{name}/infer", "/healthz")
RENDER_TIMEOUT_S = 30.0


def browser(host: str, window_size: str = "1400,1000",
            logs: tuple[str, ...] = ("performance", "browser")) -> webdriver.Chrome:
    """Headless chromium that can reach `host` only, logging `logs` (also used by explorer_browser_check.py)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", f"--window-size={window_size}",
                # The network is unreachable for the page: every name but the server's resolves to nothing,
                # and a proxy that does not exist catches anything addressed by IP.
                f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {host}",
                "--proxy-server=http://127.0.0.1:9", f"--proxy-bypass-list={host}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {log: "ALL" for log in logs})
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


def network_events(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """DevTools Network.* events logged since the last call."""
    events = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"].startswith("Network."):
            events.append(message)
    return events


def request_problems(driver: webdriver.Chrome, base: str, page: str, problems: list[str]) -> dict[str, str]:
    """Every request the page made since the last read of the log (request id -> URL); appends to `problems`
    each one to another host, each failed one and each answer >= 400."""
    origin = urlsplit(base).netloc
    urls: dict[str, str] = {}
    for event in network_events(driver):
        params = event["params"]
        if event["method"] == "Network.requestWillBeSent":
            url = params["request"]["url"]
            urls[params["requestId"]] = url
            if urlsplit(url).scheme not in ("data", "blob") and urlsplit(url).netloc != origin:
                problems.append(f"{page}: request off the host: {url}")
        elif event["method"] == "Network.loadingFailed":
            problems.append(f"{page}: request failed ({params.get('errorText')}): "
                            f"{urls.get(params['requestId'], params['requestId'])}")
        elif event["method"] == "Network.responseReceived" and params["response"]["status"] >= 400:
            problems.append(f"{page}: HTTP {params['response']['status']} for {params['response']['url']}")
    return urls


def rendered_text(driver: webdriver.Chrome) -> str:
    text = driver.execute_script("return document.body ? document.body.innerText : ''")
    return text if isinstance(text, str) else ""


def check_page(driver: webdriver.Chrome, base: str, page: str) -> list[str]:
    """Problems seen loading `page` (empty: it rendered every operation offline)."""
    problems: list[str] = []
    network_events(driver)  # drop what an earlier page logged
    driver.get(base + page)
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    missing: list[str] = list(EXPECTED_PATHS)
    while missing and time.monotonic() < deadline:
        text = rendered_text(driver)
        missing = [p for p in EXPECTED_PATHS if p not in text]
        if missing:
            time.sleep(0.25)
    if missing:
        problems.append(f"{page}: operations not listed after {RENDER_TIMEOUT_S:.0f} s: {missing}")
    time.sleep(1.0)  # late requests (fonts, images, validator) would show up in this second
    urls = request_problems(driver, base, page, problems)
    if not any(urlsplit(u).path.startswith("/docs/assets/") for u in urls.values()):
        problems.append(f"{page}: no asset was loaded from /docs/assets/ (requests: {sorted(set(urls.values()))})")
    for entry in driver.get_log("browser"):
        if entry.get("level") == "SEVERE":
            problems.append(f"{page}: console error: {entry.get('message')}")
    print(f"docs-browser: {page}: {len(urls)} requests, all to {urlsplit(base).netloc}" if not problems else
          f"docs-browser: {page}: {len(problems)} problem(s)", file=sys.stderr)
    return problems


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: docs_browser_check.py BASE_URL")
    base = sys.argv[1].rstrip("/")
    host = urlsplit(base).hostname or "127.0.0.1"
    driver = browser(host)
    try:
        problems = [p for page in ("/docs", "/redoc") for p in check_page(driver, base, page)]
    finally:
        driver.quit()
    for problem in problems:
        print(f"docs-browser: {problem}", file=sys.stderr)
    print(f"docs-browser: {2 - len({p.split(':')[0] for p in problems})} passed, "
          f"{len({p.split(':')[0] for p in problems})} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
