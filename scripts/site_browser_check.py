"""Open the built documentation site in headless chromium with every other host unreachable.

    python scripts/site_browser_check.py site        # the folder `mkdocs build` wrote

Serves the folder on a free loopback port (http.server in a thread), then, in the browser of
scripts/docs_browser_check.py (Debian's chromium and chromium-driver, nothing downloaded, every other
host name resolving to nothing): opens three pages and fails on any request to another host, any failed
request or answer >= 400; then types "yarn" into the site search and waits for a result that links to
a page of the site. Exit status 0 only if all hold. scripts/docs-test.sh builds the site and runs this.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_browser_check import browser, network_events, request_problems
from selenium import webdriver
from selenium.webdriver.common.by import By

PAGES = ("index.html", "tables.html", "operations.html")
SEARCH_TERM = "yarn"
WAIT_S = 30.0


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(folder: Path) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def page_problems(driver: webdriver.Chrome, base: str, page: str) -> list[str]:
    network_events(driver)  # drop what an earlier page logged
    driver.get(f"{base}/{page}")
    time.sleep(2.0)  # late requests (fonts, scripts, the search index) show up in these seconds
    origin = urlsplit(base).netloc
    problems: list[str] = []
    urls = request_problems(driver, base, page, problems)
    print(f"site-browser: {page}: {len(urls)} requests" + ("" if problems else f", all to {origin}"),
          file=sys.stderr)
    return problems


def search_problems(driver: webdriver.Chrome, base: str) -> list[str]:
    driver.get(f"{base}/index.html")
    deadline = time.monotonic() + WAIT_S
    titles: list[str] = []
    while time.monotonic() < deadline and not titles:
        # The search input is hidden until the search is opened; the theme listens to input events.
        driver.execute_script(
            "const i = document.querySelector('.md-search__input');"
            "document.querySelector('#__search').checked = true;"
            "i.focus(); i.value = arguments[0]; i.dispatchEvent(new Event('input', {bubbles: true}));"
            "i.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true}));", SEARCH_TERM)
        time.sleep(0.5)
        titles = [item.get_attribute("href") or "" for item in
                  driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")]
    if not titles:
        return [f"search: no result for {SEARCH_TERM!r} after {WAIT_S:.0f} s"]
    print(f"site-browser: search {SEARCH_TERM!r}: {len(titles)} results, first {titles[0]}", file=sys.stderr)
    return [] if any(urlsplit(t).netloc == urlsplit(base).netloc for t in titles) else \
        [f"search: results point off the site: {titles[:3]}"]


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: site_browser_check.py SITE_FOLDER")
    folder = Path(sys.argv[1])
    if not (folder / "index.html").is_file():
        raise SystemExit(f"{folder}/index.html missing: build the site first (mkdocs build)")
    server = serve(folder)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    driver = browser("127.0.0.1")
    try:
        problems = [p for page in PAGES for p in page_problems(driver, base, page)]
        problems += search_problems(driver, base)
    finally:
        driver.quit()
        server.shutdown()
    for problem in problems:
        print(f"site-browser: {problem}", file=sys.stderr)
    print("site-browser: " + ("FAILED" if problems else f"{len(PAGES)} pages offline, search finds {SEARCH_TERM!r}"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
