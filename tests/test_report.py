"""The HTML report in a real headless Chromium (Debian's `chromium` + `chromium-driver`, installed by
.ci/run): it loads with no broken image and no console error, and its screenshot is not blank.
Without Chromium and chromedriver the browser test FAILS (it never skips): install them with
`apt-get install -y chromium chromium-driver`.
Run: .venv/bin/python -m pytest tests/test_report.py -q
"""
from __future__ import annotations

import io
import os
import shutil

import pytest

from analysis.figures import FIGURES, Options
from analysis.load import MissingData, load_study
from analysis.report import write_report
from test_analysis_data import write_all

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("results"))
    write_all(root)
    data = load_study(root, "paper")
    out = str(tmp_path_factory.mktemp("report"))
    drawn = {}
    for name in ("iso-param", "pareto", "cross-depth", "losses"):  # three drawn, one refused with its reason
        try:
            drawn[name] = FIGURES[name](data, out, Options())
        except MissingData as e:
            drawn[name] = str(e)
    html_path, md_path = write_report(data, out, drawn, Options())
    return html_path, md_path


def test_report_is_self_contained(report):
    html_path, md_path = report
    text = open(html_path, encoding="utf-8").read()
    assert text.count("data:image/png;base64,") == 3
    for bad in ("src='http", 'src="http', "<link", "<script"):
        assert bad not in text
    assert "Not drawn: losses needs" in text
    md = open(md_path, encoding="utf-8").read()
    assert "![iso-param](iso_param.png)" in md and "| task_variant |" in md


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail(f"chromium ({CHROMIUM or 'missing'}) and chromedriver ({CHROMEDRIVER or 'missing'}) are needed: "
                    "apt-get install -y chromium chromium-driver (.ci/run installs them)", pytrace=False)
    from selenium import webdriver  # the [test] extra; a missing selenium fails here too
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1600",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    os.environ.setdefault("SE_AVOID_STATS", "true")  # selenium manager: no telemetry, and it is not needed here
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()  # ends the chromedriver and Chromium this fixture started


def test_report_renders_in_headless_chromium(report, browser):
    from matplotlib import image as mpimg

    browser.get("file://" + os.path.abspath(report[0]))
    assert browser.execute_script("return document.readyState") == "complete"
    assert "R-MDM study report" in browser.title
    imgs = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.alt]);")
    assert len(imgs) == 3
    broken = [alt for ok, w, h, alt in imgs if not (ok and w > 100 and h > 100)]
    assert not broken, f"broken images: {broken}"
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors
    tables = browser.execute_script("return document.querySelectorAll('table').length")
    assert tables >= 4  # parameter counts, crossings, iso-FLOP pairs, provenance
    px = mpimg.imread(io.BytesIO(browser.get_screenshot_as_png()), format="png")  # (H, W, RGBA) floats in [0, 1]
    gray = px[..., :3].mean(axis=-1)
    assert gray.std() > 0.05, "screenshot is blank"
    assert (gray < 0.5).mean() > 0.005, "screenshot has almost no dark (text) pixels"


def test_browser_test_fails_without_chromium(tmp_path):
    """CI must not pass quietly when Chromium is missing: with no chromium on PATH the test above fails."""
    import subprocess
    import sys

    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # the venv's bin: no chromium, no chromedriver
    r = subprocess.run([sys.executable, "-m", "pytest", os.path.abspath(__file__), "-q", "-p", "no:randomly",
                        "-k", "renders_in_headless_chromium", f"--basetemp={tmp_path / 'inner'}"],
                       env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "1 error" in r.stdout and "apt-get install -y chromium chromium-driver" in r.stdout, r.stdout[-2000:]
    assert "skipped" not in r.stdout
