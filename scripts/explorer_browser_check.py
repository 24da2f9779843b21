"""Drive the explorer page (GET /) of a live posenc in headless chromium with every other host unreachable.

    python scripts/explorer_browser_check.py http://127.0.0.1:8000 [--screenshot FILE]

Needs selenium (>= 4.20) plus Debian's chromium and chromium-driver (no download: both paths are
given, Selenium Manager stays offline). Checks: the page loads and draws the table and properties
pictures and the summary; the console logs no error; changing a parameter (head_dim) and then the
family redraws (new picture URLs, loaded, the curl command follows); picking a model preset fills the form
with its parameters and redraws with ?preset= (the list offers only the family's presets); a screenshot is
not blank.
Exit status 0 only if all hold. scripts/browser-test.sh starts the server and runs this.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
import zlib
from collections.abc import Callable
from urllib.parse import urlsplit

from docs_browser_check import browser  # scripts/ is on the path when this runs as a script
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

TIMEOUT_S = 90.0  # the first pictures import matplotlib on the server


def wait_for(what: str, condition: Callable[[], object]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}")


def state(driver: webdriver.Chrome) -> str:
    return str(driver.execute_script("return document.body.dataset.state"))


def picture_loaded(driver: webdriver.Chrome, element_id: str, needle: str) -> bool:
    return bool(driver.execute_script(
        "const img = document.getElementById(arguments[0]);"
        "return img.src.includes(arguments[1]) && img.complete && img.naturalWidth > 0;", element_id, needle))


def wait_ready(driver: webdriver.Chrome, needle: str) -> None:
    def ready() -> bool:
        if state(driver) == "error":
            raise AssertionError("the page shows an error: " + driver.find_element(By.ID, "error").text)
        return state(driver) == "ready" and all(picture_loaded(driver, p, needle)
                                                for p in ("table-picture", "properties-picture"))
    wait_for(f"both pictures with {needle!r}", ready)


def png_distinct_bytes(png: bytes) -> int:
    """Distinct byte values in the decompressed pixel data of a PNG (a blank page has very few)."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n"), "screenshot is not a PNG"
    data, position = b"", 8
    while position < len(png):
        (length,) = struct.unpack(">I", png[position:position + 4])
        kind = png[position + 4:position + 8]
        if kind == b"IDAT":
            data += png[position + 8:position + 8 + length]
        position += 12 + length
    return len(set(zlib.decompress(data)))


def console_errors(driver: webdriver.Chrome) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def check_preset_picker(driver: webdriver.Chrome) -> list[str]:
    """On the alibi family: the picker lists ALiBi models only; BLOOM-560m fills num_heads 16 and mode bloom."""
    problems = []
    picker = Select(driver.find_element(By.ID, "preset"))
    offered = [option.get_attribute("value") for option in picker.options]
    if "bloom-560m" not in offered or "llama-3.1-8b" in offered:
        problems.append(f"the preset picker does not offer the alibi models only: {offered}")
        return problems
    picker.select_by_value("bloom-560m")
    wait_ready(driver, "preset=bloom-560m")
    filled = {name: driver.find_element(By.ID, f"param-{name}").get_attribute("value")
              for name in ("num_heads", "mode")}
    if filled != {"num_heads": "16", "mode": "bloom"}:
        problems.append(f"the preset did not fill the form: {filled}")
    if "preset=bloom-560m" not in driver.find_element(By.ID, "table-curl").text:
        problems.append("the curl command does not name the preset")
    return problems


def check(base: str, screenshot: str | None) -> list[str]:
    problems: list[str] = []
    driver = browser(urlsplit(base).hostname or "127.0.0.1", window_size="1300,1800", logs=("browser",))
    try:
        driver.get(base + "/")
        wait_ready(driver, "/v1/")
        summary = driver.find_element(By.ID, "summary").text
        for key in ("relativity_max_residual", "min_pair_distance"):
            if key not in summary:
                problems.append(f"summary lacks {key}: {summary[:200]!r}")
        head_dim = driver.find_element(By.ID, "param-head_dim")
        head_dim.clear()
        head_dim.send_keys("32")
        wait_ready(driver, "head_dim=32")
        if "head_dim=32" not in driver.find_element(By.ID, "properties-curl").text:
            problems.append("the curl command did not follow the new head_dim")
        Select(driver.find_element(By.ID, "family")).select_by_value("alibi")
        wait_ready(driver, "num_heads=8")
        if "/v1/alibi/bias?" not in driver.find_element(By.ID, "table-url").text:
            problems.append("the table URL did not follow the family")
        problems += check_preset_picker(driver)
        shot = driver.get_screenshot_as_png()
        if screenshot:
            with open(screenshot, "wb") as fh:
                fh.write(shot)
        distinct = png_distinct_bytes(shot)
        if distinct < 32:
            problems.append(f"the screenshot looks blank ({distinct} distinct byte values)")
        problems += [f"console error: {message}" for message in console_errors(driver)]
    except AssertionError as exc:
        problems.append(str(exc))
        problems += [f"console error: {message}" for message in console_errors(driver)]
    finally:
        driver.quit()
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="server URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--screenshot", help="write the final screenshot here")
    args = parser.parse_args()
    problems = check(args.base.rstrip("/"), args.screenshot)
    for problem in problems:
        print(f"explorer-browser-check: {problem}", file=sys.stderr)
    if not problems:
        print("explorer-browser-check: OK (loads, redraws on parameter and family changes, no console errors)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
