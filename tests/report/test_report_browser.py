"""The report in a real headless browser: its first screen is drawn in under 2 s, with screenshots taken into a
folder (``IB_SCREENSHOTS``, else the test's temporary folder). ``IB_BEFORE_REPORT`` / ``IB_AFTER_REPORT`` name two
more pages (e.g. the default run's report before and after a change) to measure and photograph beside it; their
numbers go to ``load-times.txt`` in the same folder, and the after page is held to the same 2 s."""

import os
import shutil
from pathlib import Path

import pytest

from tests.browser import chromium, measure
from tests.report.test_report import runs  # noqa: F401  (the module's run folders, a fixture)

LIMIT_MS = 2000

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install -y "
                                                           "chromium); the load-time check needs a real browser")


def _folder(tmp_path) -> Path:
    folder = Path(os.environ.get("IB_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_first_screen_loads_under_two_seconds(runs, tmp_path):  # noqa: F811
    folder = _folder(tmp_path)
    times = measure(runs["report"], folder / "tiny-first-screen.png")
    assert (folder / "tiny-first-screen.png").stat().st_size > 10_000
    assert all(t["lazy"] for t in times)  # the page waited for plotly and the figures in view
    assert min(t["load_ms"] for t in times) < LIMIT_MS, times
    lines = [f"tiny run report: {runs['report'].stat().st_size:,} bytes; first screen ms "
             + ", ".join(f"{t['load_ms']:.0f}" for t in times)]
    for tag in ("BEFORE", "AFTER"):
        page = os.environ.get(f"IB_{tag}_REPORT")
        if not page:
            continue
        copy = tmp_path / tag.lower() / "report.html"  # measured from a copy: the run folder is left as it is
        copy.parent.mkdir()
        shutil.copy(page, copy)
        got = measure(copy, folder / f"{tag.lower()}-first-screen.png")
        lines.append(f"{tag.lower()}: {page}: {copy.stat().st_size:,} bytes; first screen ms "
                     + ", ".join(f"{t['load_ms']:.0f} (load event {t['onload_ms']:.0f})" for t in got))
        if tag == "AFTER":
            assert min(t["load_ms"] for t in got) < LIMIT_MS, got
            assert copy.stat().st_size <= 3_000_000
    (folder / "load-times.txt").write_text("\n".join(lines) + "\n")


def test_table_of_every_number_filters_in_the_browser(runs):  # noqa: F811
    from tests.browser import Browser

    script = """(function () {
      var box = document.getElementById("rows-filter"), count = document.getElementById("rows-count"), out = [];
      ["", "pc1", "zzzz-no-such-row"].forEach(function (w) {
        box.value = w; box.dispatchEvent(new Event("input")); out.push(count.textContent); });
      return out.join("|"); })()"""
    with Browser() as b:
        b.open(runs["report"])
        every, pc1, none = b.evaluate(script).split("|")
    n = int(every.split()[0])
    assert 0 < int(pc1.split()[0]) < n and none == "0 rows shown"
