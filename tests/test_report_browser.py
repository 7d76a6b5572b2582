"""The report as a reader sees it: ``reports/index.html`` of the session's tiny DAG (``tiny_dag``) opened in
headless Chromium (:mod:`r2m.reports.browser`) at a desktop and a phone width, and measured by JavaScript
evaluated in the page: nothing sticks out past the viewport's edge, every image loaded, every link lands
somewhere, and each claim's verdict can be read without scrolling sideways. The expectations come from
outside the page: the viewport's width, the files on disk, ``claims.csv`` and the figures' ``index.json``.

A table of scores wider than the screen may scroll inside its own box (``div.scroll``, ``overflow-x: auto``):
that box is measured, not the table in it; nothing else may scroll sideways."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from r2m.reports.browser import INSTALL, Browser, find_chromium

DESKTOP, PHONE = 1280, 390
WIDTHS = (DESKTOP, PHONE)

pytestmark = [pytest.mark.slow,  # reads the session's tiny DAG
              pytest.mark.skipif(find_chromium() is None,
                                 reason=f"no Chromium to open the report in: {INSTALL} (make test installs it)")]

# One pass over the page. Rectangles are in CSS pixels of the layout viewport (documentElement.clientWidth).
MEASURE = r"""
(() => {
  const vw = document.documentElement.clientWidth, vh = document.documentElement.clientHeight;
  const label = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
    + (typeof e.className === 'string' && e.className.trim() ? '.' + e.className.trim().split(/\s+/).join('.') : '');
  const where = e => { const p = []; for (let x = e; x && x !== document.body; x = x.parentElement) p.unshift(label(x));
                       return p.join(' > '); };
  // the boxes between an element and the page that clip or scroll their content sideways
  const clips = e => { const out = [];
    for (let x = e.parentElement; x && x !== document.body; x = x.parentElement)
      if (getComputedStyle(x).overflowX !== 'visible') out.push(x);
    return out; };
  const box = r => [Math.round(r.left), Math.round(r.right)];

  const outside = [], scrolling = [];
  for (const e of document.body.querySelectorAll('*')) {
    const s = getComputedStyle(e);
    if (['auto', 'scroll'].includes(s.overflowX) && e.scrollWidth > e.clientWidth + 1)
      scrolling.push({element: where(e), content: e.scrollWidth, box: e.clientWidth});
    if (clips(e).length) continue;                      // measured through the box that holds it
    const r = e.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;      // not laid out (display: none)
    if (r.left < -0.5 || r.right > vw + 0.5) outside.push({element: where(e), box: box(r)});
  }

  const images = [...document.images].map(i => ({src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0}));
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id);
  const links = [...document.querySelectorAll('a[href]')].map(a => {
    const href = a.getAttribute('href');
    return href.startsWith('#') ? {href, target: !!document.getElementById(decodeURIComponent(href.slice(1)))}
                                : {href, url: a.href};
  });

  const verdicts = [...document.querySelectorAll('.verdict')].map(v => {
    window.scrollTo(0, Math.max(0, v.getBoundingClientRect().top + window.scrollY - vh / 3));
    const r = v.getBoundingClientRect();
    let seen = r.width > 0 && r.height > 0 && window.scrollX === 0
      && r.left >= 0 && r.right <= vw && r.top >= 0 && r.bottom <= vh;
    for (const c of clips(v)) {
      const b = c.getBoundingClientRect();
      if (r.left < b.left - 0.5 || r.right > b.right + 0.5 || r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5) seen = false;
    }
    const hit = seen ? document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2) : null;
    seen = seen && !!hit && (hit === v || v.contains(hit));  // nothing covers it, nothing folds it away
    return {text: v.textContent.trim(), seen, element: where(v), box: box(r)};
  });
  window.scrollTo(0, 0);
  return {viewport: vw, page: document.documentElement.scrollWidth, outside, scrolling, images, ids, links, verdicts};
})()
"""


@pytest.fixture(scope="module")
def report(tiny_dag) -> Path:
    page = tiny_dag / "reports/index.html"
    assert page.is_file(), f"the tiny DAG wrote no {page}"
    return page


@pytest.fixture(scope="module")
def seen(report) -> dict[int, dict]:
    """What the page measures of itself at each width."""
    with Browser() as browser:
        return {width: browser.open(report, width).evaluate(MEASURE) for width in WIDTHS}


@pytest.mark.parametrize("width", WIDTHS)
def test_nothing_is_wider_than_the_viewport(seen, width):
    got = seen[width]
    assert got["viewport"] == width
    assert got["outside"] == [], f"at {width} px, past the viewport's edges (left, right): {got['outside'][:5]}"
    assert got["page"] <= width, f"at {width} px the page scrolls sideways ({got['page']} px wide)"
    others = [box for box in got["scrolling"] if not box["element"].endswith("div.scroll")]
    assert others == [], f"at {width} px, boxes other than a wide table's scroll sideways: {others}"


@pytest.mark.parametrize("width", WIDTHS)
def test_every_image_loaded(seen, report, width):
    images = seen[width]["images"]
    assert images and [i["src"] for i in images if not i["loaded"]] == []
    index = json.loads((report.parent / "figures/tiny/index.json").read_text())
    shown = {i["src"] for i in images}
    for fig in index["figures"]:  # every figure of the figures stage but the examples (shown as cards) is on the page
        if fig.get("kind") != "examples":
            assert f"figures/tiny/{fig['file']}" in shown, fig["file"]
    for ex in index["examples"]:
        if ex.get("thumbnail"):
            assert f"figures/tiny/{ex['thumbnail']}" in shown, ex["thumbnail"]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_link_lands(seen, report, width):
    got = seen[width]
    assert len(got["ids"]) == len(set(got["ids"])), "an id is given twice: a link to it is ambiguous"
    assert got["links"], "the page has no links (its navigation is gone)"
    for link in got["links"]:
        if link["href"].startswith("#"):
            assert link["target"], f"{link['href']}: no element has this id"
        else:
            url = urlparse(link["url"])
            assert url.scheme == "file", f"{link['href']}: the report links outside itself"
            assert Path(unquote(url.path)).is_file(), f"{link['href']}: no such file beside the report"


@pytest.mark.parametrize("width", WIDTHS)
def test_each_claims_verdict_is_in_view(seen, report, width):
    with open(report.parent / "claims.csv", newline="") as f:
        verdicts = [row["verdict"] for row in csv.DictReader(f)]
    assert verdicts, "the tiny DAG's claims.csv has no rows to show"
    got = seen[width]["verdicts"]
    assert [v["text"] for v in got] == verdicts
    hidden = [v for v in got if not v["seen"]]
    assert hidden == [], f"at {width} px, {len(hidden)} of {len(got)} verdicts are out of view: {hidden[:3]}"
