#!/usr/bin/env python3
"""Check the built book the way a reader sees it: in headless Chromium, with the network closed.

Usage: python .ci/check_rendered.py [HTML_DIR] [--chromium PATH] [--budget-ms MS] [--jobs N]
                                    [--pages NAME ...]

HTML_DIR (default ``_build/html``) is served from a local HTTP server on 127.0.0.1 (the handler of
``python -m http.server``); Chromium may resolve no other host. Each page under ``HTML_DIR/book/``
(the chapters, the appendices and, in ``book/api/``, the API reference) is loaded with
``chromium --headless ... --virtual-time-budget=MS --dump-dom URL`` and must show:

* math: when the built page holds math for MathJax (elements of class ``math``), at least as many
  ``<mjx-container>`` elements in the DOM (MathJax typeset each of them), no MathJax error
  (``<mjx-merror>``, or an undefined macro, which MathJax shows in red: read from the hidden
  MathML copy and, since MathJax 4 names the TeX of each part, from the shown one), and no raw
  TeX (``$...$``, ``$$``, ``\\(``, ``\\[``) in the visible text outside code;
* widgets: when the page embeds ipywidgets views
  (``<script type="application/vnd.jupyter.widget-view+json">``), as many rendered views: a
  ``<div class="widget-subarea">`` holding an element of class ``jupyter-widgets``;
* interactive figures (``gaugebook.interactive``: ``<div class="gb-interactive">``, which respond
  without a kernel): the server adds a probe script to each page that holds one; after the page
  loaded, it moves every control of every such figure through each of its values in turn (the
  others held at their start), firing ``input`` and ``change`` as a reader's hand would, and
  records whether exactly one frame is visible, whether it changed and whether it fits its
  column (the window is 1280 px wide). A figure that shows no frame, a control move after which
  the figure did not change, or a frame wider than the column fails the page;
* widths: no code cell (folded ``hide-input`` cells opened) and no output scrolls sideways
  in the 1280 px window, measured in the page (the book's code and printed text are at most
  88 columns and its style sheet makes 88 columns fit): a ``<pre>`` wider than its box, or a
  table wider than its cell's output area; nor does any displayed equation (the theme lets a
  wide one scroll inside its box, so that its right end is hidden until the reader scrolls);
  rendered a second time in a phone's 390 px wide frame (headless Chromium's window is at
  least 500 px wide), the page as a whole does not scroll sideways (a code block, table or
  equation may scroll inside its own box there); at either width, MathJax breaks each display
  equation at the width of its box (a display it breaks at a smaller width wastes lines), and
  no cell of an aligned block overlaps the next one;
* figures: every image of the page's own (a file under ``_images/``) is a link, so that a reader
  whose screen shrinks it can open it at full size: a figure's to its 300-dpi PNG
  (``figure_files``), any other to itself (``gaugebook.js``);
* offline: no script or stylesheet is referenced on another host, and the local server answered
  every request the pages made (no 404 other than ``/favicon.ico``); every link to a file of the
  book (a relative URL: a page, a figure's slide files) names a file the build has;
* one search field, the sidebar's: no theme header bar above the page holding a second one;
* no cell output on stderr: a warning or a log message (e.g. matplotlib's ``findfont`` when
  its font cache is stale) is bookkeeping the reader should not see;
* scripts: no JavaScript error in the console: neither an uncaught one (such as a script that
  the page loads twice: "Identifier ... has already been declared"), read from Chromium's log,
  nor a ``console.error`` call, an unhandled promise rejection or a resource that failed to
  load, which a recorder script that the server puts first in every page's ``<head>`` collects
  and writes into the DOM once the page has loaded.

Exit status 0 when every page passes; otherwise 1, after a message naming each failure.
Standard library only.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import functools
import html
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--hide-scrollbars",  # as a phone's, which overlay the page instead of taking its width
    # close the network: every host name but 127.0.0.1 fails to resolve
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--enable-logging=stderr", "--v=0",  # JavaScript console messages go to stderr
)
WINDOW = "1280,1024"  # the width the pages are measured at
PHONE = "390,844"  # a phone's: each page is rendered a second time in a frame of this size
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SKIP_TEXT = {"script", "style", "pre", "code", "kbd", "samp", "textarea", "noscript", "svg",
             "template", "head", "mjx-container"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
RAW_TEX = [
    ("\\(", re.compile(r"\\\(")),
    ("\\[", re.compile(r"\\\[")),
    ("$$", re.compile(r"\$\$")),
    ("$...$", re.compile(r"(?<![\\$])\$[^\s$][^$\n]*?(?<![\s\\])\$")),
]
INTERACTIVE = "gb-interactive"  # the class of gaugebook.interactive's figures
REPORT_ID = "gb-interactive-report"
# Run after the page's own scripts (on load, then a moment later): moves every control of every
# interactive figure through its values and writes what it saw, as JSON, into <pre id=REPORT_ID>.
PROBE = """<script>window.addEventListener("load", function () { setTimeout(function () {
  var report = [], figures = document.querySelectorAll(".%(cls)s");
  for (var f = 0; f < figures.length; f++) {
    var fig = figures[f];
    var visible = function () {
      var v = fig.querySelectorAll("[data-gb-frame]:not([hidden])");
      return {n: v.length, html: v.length ? v[0].innerHTML : ""};
    };
    var entry = {id: fig.id, start: visible().n, controls: [], overflow: []};
    var column = fig.closest("article, main") || document.body;
    var wide = function () {
      return fig.scrollWidth > column.clientWidth + 1
        || fig.getBoundingClientRect().right > column.getBoundingClientRect().right + 1;
    };
    if (wide()) { entry.overflow.push("start"); }
    var controls = fig.querySelectorAll("[data-gb-control]");
    for (var i = 0; i < controls.length; i++) {
      var c = controls[i], start = c.value, n = c.tagName === "SELECT" ? c.options.length
        : Number(c.max) - Number(c.min) + 1;
      var moves = 0, unchanged = [], bad = [];
      for (var k = 0; k < n; k++) {
        if (String(k) === start) { continue; }
        var before = visible();
        c.value = String(k);
        c.dispatchEvent(new Event("input", {bubbles: true}));
        c.dispatchEvent(new Event("change", {bubbles: true}));
        var after = visible();
        moves++;
        if (after.n !== 1) { bad.push(k); }
        if (after.html === before.html) { unchanged.push(k); }
        if (wide()) { entry.overflow.push(k); }
      }
      c.value = start;
      c.dispatchEvent(new Event("change", {bubbles: true}));
      var label = c.closest("label");
      entry.controls.push({name: label ? label.firstChild.textContent.trim() : String(i),
                           moves: moves, unchanged: unchanged, bad: bad});
    }
    report.push(entry);
  }
  var pre = document.createElement("pre");
  pre.id = "%(report)s";
  pre.textContent = JSON.stringify(report);
  document.body.appendChild(pre);
}, 500); });</script>""" % {"cls": INTERACTIVE, "report": REPORT_ID}
ERRORS_ID = "gb-console-errors"
RECORDER = """<script>(function () {
  var seen = [], original = console.error;
  console.error = function () {
    seen.push(Array.prototype.map.call(arguments, String).join(" "));
    return original.apply(console, arguments);
  };
  window.addEventListener("error", function (e) {
    var t = e.target;
    seen.push(e.message || "failed to load " + ((t && (t.src || t.href)) || "a resource"));
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    seen.push("unhandled promise rejection: " + e.reason);
  });
  window.addEventListener("load", function () { setTimeout(function () {
    var pre = document.createElement("pre");
    pre.id = "%s";
    pre.textContent = JSON.stringify(seen);
    document.body.appendChild(pre);
  }, 1500); });
})();</script>""" % ERRORS_ID
WIDTHS_ID = "gb-widths"
# Run on every page once it has loaded and MathJax has typeset it: which code cells (inputs,
# folded ones opened first: a reader is one click from them) and outputs (text, tables) scroll
# sideways in the 1280 px window (wider than their box); either fails the page (the book's code
# and printed text are at most 88 columns, which the book's style sheet makes fit). Also which
# display equations scroll, which MathJax measured at a width other than their box's, and which
# aligned blocks have overlapping cells.
WIDTHS = """<script>window.addEventListener("load", function () {
  // after MathJax has typeset the page (on a busy machine it can still be at work at "load")
  var typeset = (window.MathJax && MathJax.startup && MathJax.startup.promise) || Promise.resolve();
  typeset.then(function () { setTimeout(function () {
  var folds = document.querySelectorAll(".tag_hide-input details, .tag_hide-cell details");
  for (var f = 0; f < folds.length; f++) { folds[f].open = true; }
  var scrolls = function (selector) {
    var out = [], blocks = document.querySelectorAll(selector);
    for (var i = 0; i < blocks.length; i++) {
      var b = blocks[i];
      if (b.offsetParent !== null && b.scrollWidth > b.clientWidth + 1) {
        out.push(b.textContent.split("\\n").sort(function (x, y) { return y.length - x.length; })[0]
                 .slice(0, 100));
      }
    }
    return out;
  };
  var tables = function () {
    var out = [], found = document.querySelectorAll("div.cell_output table");
    for (var i = 0; i < found.length; i++) {
      var t = found[i], box = t.closest("div.cell_output");
      if (t.offsetParent !== null && t.getBoundingClientRect().width > box.clientWidth + 1) {
        out.push("table: " + t.textContent.replace(/\\s+/g, " ").trim().slice(0, 90));
      }
    }
    return out;
  };
  var equations = function () {  // display math scrolls inside its container (the theme's)
    var out = [], found = document.querySelectorAll("div.math mjx-container");
    for (var i = 0; i < found.length; i++) {
      var m = found[i];
      if (m.offsetParent !== null && m.scrollWidth > m.clientWidth + 1) {
        var items = window.MathJax && MathJax.startup.document.getMathItemsWithin(m);
        var tex = items && items.length ? items[0].math : m.textContent;
        out.push("equation: " + tex.replace(/\\s+/g, " ").trim().slice(0, 90));
      }
    }
    return out;
  };
  // displays that MathJax breaks at a width other than their box's: the width it measured
  // with a test element next to the equation (a flex item of div.math, which must not shrink)
  var measured = function () {
    var out = [], items = window.MathJax && MathJax.startup.document
      ? Array.from(MathJax.startup.document.math) : [];
    items.forEach(function (item) {
      var box = item.display && item.typesetRoot && item.typesetRoot.parentElement;
      if (box && box.offsetParent !== null &&
          Math.abs(item.metrics.containerWidth - box.clientWidth) > 2) {
        out.push("equation measured " + Math.round(item.metrics.containerWidth) +
                 " px wide in a " + box.clientWidth + " px box: " +
                 item.math.replace(/\\s+/g, " ").trim().slice(0, 60));
      }
    });
    return out;
  };
  // aligned blocks whose cells overlap: the typeset content of a cell reaching into the next.
  // A cell's content is the union of its MathJax boxes (elements), which MathJax sizes from
  // its font's metrics; not of its text, whose glyphs, drawn by the browser, may overhang
  // their boxes by a pixel or two (cells that touch then "overlapped" on one machine)
  var content = function (cell) {
    var left = Infinity, right = -Infinity, boxes = cell.querySelectorAll("*");
    for (var k = 0; k < boxes.length; k++) {
      var r = boxes[k].getBoundingClientRect();
      if (r.width > 0) { left = Math.min(left, r.left); right = Math.max(right, r.right); }
    }
    return {left: left, right: right, width: Math.max(right - left, 0)};
  };
  var overlaps = function () {
    var out = [], rows = document.querySelectorAll("div.math mjx-mtr, div.math mjx-mlabeledtr");
    for (var i = 0; i < rows.length; i++) {
      var cells = Array.from(rows[i].children).filter(function (c) {
        return c.tagName.toLowerCase() === "mjx-mtd";
      }).map(content).filter(function (r) { return r.width > 0; });
      for (var j = 1; j < cells.length; j++) {
        if (cells[j - 1].right > cells[j].left + 1) {
          out.push("cells overlap in: " + rows[i].closest("div.math").textContent
                   .replace(/\\s+/g, " ").trim().slice(0, 70));
          break;
        }
      }
    }
    return Array.from(new Set(out));
  };
  // the elements that widen the page past the window: the outermost ones that reach past
  // its right edge outside any box that scrolls or clips
  var widening = function () {
    var out = [], all = document.querySelectorAll("body *"), edge = window.innerWidth + 1;
    var contained = function (e) {
      for (var a = e.parentElement; a && a !== document.body; a = a.parentElement) {
        if (getComputedStyle(a).overflowX !== "visible") { return true; }
      }
      return false;
    };
    for (var i = 0; i < all.length && out.length < 5; i++) {
      var e = all[i], p = e.parentElement;
      if (e.offsetParent === null || e.getBoundingClientRect().right <= edge) { continue; }
      if (p && p !== document.body && p.getBoundingClientRect().right > edge) { continue; }
      if (contained(e)) { continue; }
      out.push(e.tagName.toLowerCase() + (e.className ? "." + String(e.className).split(" ")[0]
               : "") + ": " + e.textContent.replace(/\\s+/g, " ").trim().slice(0, 70));
    }
    return out;
  };
  var pre = document.createElement("pre");
  pre.id = "%s";
  pre.textContent = JSON.stringify({inputs: scrolls("div.cell_input pre"),
                                    outputs: scrolls("div.cell_output pre").concat(tables()),
                                    math: equations(), measured: measured().concat(overlaps()),
                                    page: document.documentElement.scrollWidth >
                                          window.innerWidth + 1 ? widening() : []});
  document.body.appendChild(pre);
  if (window.parent !== window) {  // in the phone frame (PHONE_FRAME): report to the frame's page
    window.parent.document.body.appendChild(window.parent.document.importNode(pre, true));
  }
}, 700); }); });</script>""" % WIDTHS_ID
# Headless Chromium makes no window narrower than 500 px (--window-size=390,... gives a page
# 500 px wide), so a page is rendered at a phone's width inside a frame of that width; its width
# probe writes its report into the frame's page, which Chromium dumps.
PHONE_FRAME = "/__phone__"
CONSOLE_ERROR = re.compile(r'CONSOLE[^\]]*\] "(Uncaught[^"]*)", source: ([^ ]*)')


def classes(attrs) -> list[str]:
    return (dict(attrs).get("class") or "").split()


class StaticPage(HTMLParser):
    """What the built (not yet scripted) HTML contains."""

    def __init__(self) -> None:
        super().__init__()
        self.math = 0           # elements of class "math": MathJax must typeset each
        self.widget_views = 0   # embedded widget views: the embedder must render each
        self.interactive = 0    # gaugebook.interactive figures: each control must respond
        self.remote = []        # scripts and stylesheets on another host
        self.local_links = []   # links to files of the book (relative URLs), without #fragment
        self.anchors = []       # links within the page (#fragment)
        self.ids = set()        # the page's element ids: what those links can reach
        self.stderr = 0         # cell outputs on stderr (warnings, log messages)
        self.search_fields = 0  # the theme's search buttons: one, in the sidebar

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and {"output", "stderr"} <= set(classes(attrs)):
            self.stderr += 1
        if "math" in classes(attrs):
            self.math += 1
        if tag == "button" and "search-button-field" in classes(attrs):
            self.search_fields += 1
        if tag == "script" and a.get("type") == WIDGET_VIEW:
            self.widget_views += 1
        if tag == "div" and INTERACTIVE in classes(attrs):
            self.interactive += 1
        if a.get("id"):
            self.ids.add(a["id"])
        href = a.get("href") if tag == "a" else None
        if href and href.startswith("#") and len(href) > 1:
            self.anchors.append(href[1:])
        if href and not re.match(r"[a-z][a-z0-9+.-]*:|//|#", href):
            self.local_links.append(href.split("#")[0].split("?")[0])
        url = a.get("src") if tag == "script" else a.get("href") if tag == "link" else None
        if url and re.match(r"(https?:)?//", url) and (tag == "script" or "stylesheet" in (a.get("rel") or "")):
            self.remote.append(url)

    handle_startendtag = handle_starttag


class RenderedPage(HTMLParser):
    """What the DOM holds after Chromium ran the page's scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.mjx = 0
        self.mjx_errors = []
        self.text = []
        self.subareas = []      # one flag per widget-subarea: does it hold a rendered widget?
        self._stack = []        # open elements: (tag, skips text, index of the subarea it opens)
        self._skip = 0
        self._red_mtext = False

    def _open_subareas(self):
        return [i for _, _, i in self._stack if i is not None]

    def handle_starttag(self, tag, attrs):
        cls = classes(attrs)
        a = dict(attrs)
        if tag == "mjx-container":
            self.mjx += 1
        if tag in ("mjx-merror", "merror"):
            self.mjx_errors.append(a.get("data-mjx-error") or a.get("title") or "MathJax error")
        if (tag == "mjx-mtext" and "color: red" in (a.get("style") or "")  # MathJax 4
                and re.fullmatch(r"\\[A-Za-z]+", a.get("data-latex") or "")):
            self.mjx_errors.append(f"undefined control sequence {a['data-latex']}")
        self._red_mtext = tag == "mtext" and a.get("mathcolor") == "red"
        if "jupyter-widgets" in cls and self._open_subareas():
            self.subareas[self._open_subareas()[-1]] = True
        if tag in VOID:
            return
        subarea = None
        if tag == "div" and "widget-subarea" in cls:
            self.subareas.append(False)
            subarea = len(self.subareas) - 1
        skips = tag in SKIP_TEXT
        self._skip += skips
        self._stack.append((tag, skips, subarea))

    def handle_startendtag(self, tag, attrs):
        if tag not in VOID:  # <x/> in SVG or MathML: opens and closes at once
            self.handle_starttag(tag, attrs)
            self.handle_endtag(tag)
        else:
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        self._red_mtext = False
        for k in range(len(self._stack) - 1, -1, -1):
            if self._stack[k][0] == tag:
                for _, skips, _ in self._stack[k:]:
                    self._skip -= skips
                del self._stack[k:]
                return

    def handle_data(self, data):
        if self._red_mtext and data.startswith("\\"):
            self.mjx_errors.append(f"undefined control sequence {data}")
        if not self._skip:
            self.text.append(data)


@dataclass
class Result:
    page: str
    static: StaticPage
    rendered: RenderedPage | None = None
    failures: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    interactive: list[dict] = field(default_factory=list)
    seconds: float = 0.0


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """The handler of ``python -m http.server``, recording each request instead of printing it."""

    requests: list[tuple[str, int]] = []
    lock = threading.Lock()

    def log_request(self, code="-", size="-"):
        with self.lock:
            self.requests.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        """Serve each page with the console recorder (:data:`RECORDER`) first in its head, and
        a page that holds an interactive figure also with the probe (:data:`PROBE`);
        ``PHONE_FRAME?/page`` is a page that shows ``/page`` in a phone-sized frame."""
        if self.path.startswith(PHONE_FRAME + "?"):
            width, height = PHONE.split(",")
            page = html.escape(self.path.split("?", 1)[1], quote=True)
            self._send_html(f'<!DOCTYPE html><html><body style="margin:0"><iframe src="{page}" '
                            f'style="width:{width}px;height:{height}px;border:0"></iframe>'
                            "</body></html>")
            return
        path = self.translate_path(self.path)
        if path.endswith(".html") and os.path.isfile(path):
            text = Path(path).read_text(encoding="utf-8")
            text = re.sub(r"<head[^>]*>", lambda m: m.group(0) + RECORDER, text, count=1)
            text = text.replace("</body>", WIDTHS + "</body>", 1)
            if f'class="{INTERACTIVE}"' in text:
                text = text.replace("</body>", PROBE + "</body>", 1)
            if RECORDER in text:
                self._send_html(text)
                return
        super().do_GET()

    def _send_html(self, text: str) -> None:
        body = text.encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def find_chromium(explicit: str | None) -> str:
    for name in ([explicit] if explicit else []) + [os.environ.get("CHROMIUM", "")] + list(CHROMIUM_NAMES):
        if name and (path := shutil.which(name)):
            return path
    sys.exit("check_rendered: no Chromium found. Install the Debian package 'chromium' "
             "(.ci/run does) or pass --chromium PATH.")


def render(chromium: str, url: str, budget_ms: int, window: str = WINDOW) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        proc = subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--window-size={window}", f"--user-data-dir={profile}",
             f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or "<html" not in proc.stdout:
        raise RuntimeError(f"chromium exited with {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout, proc.stderr


def check_interactive(dom: str, expected: int, failures: list[str]) -> list[dict]:
    """Read the probe's report from the DOM; add a failure for each figure or control that did
    not respond. Returns the report (one entry per figure)."""
    if not expected:
        return []
    match = re.search(rf'<pre id="{REPORT_ID}"[^>]*>(.*?)</pre>', dom, re.S)
    if not match:
        failures.append(f"the probe of the {expected} interactive figures did not report "
                        "(a script error before it ran?)")
        return []
    report = json.loads(html.unescape(match.group(1)))
    if len(report) != expected:
        failures.append(f"{len(report)} of {expected} interactive figures in the DOM")
    for fig in report:
        if fig["start"] != 1:
            failures.append(f"interactive figure {fig['id']}: {fig['start']} frames visible "
                            "before any move (one expected)")
        if fig.get("overflow"):
            failures.append(f"interactive figure {fig['id']} is wider than its column at "
                            f"{len(fig['overflow'])} of its frames")
        if not fig["controls"]:
            failures.append(f"interactive figure {fig['id']} has no control")
        for c in fig["controls"]:
            where = f"interactive figure {fig['id']}, control {c['name']!r}"
            if not c["moves"]:
                failures.append(f"{where}: no other value to move to")
            if c["bad"]:
                failures.append(f"{where}: not exactly one frame visible at values {c['bad']}")
            if c["unchanged"]:
                failures.append(f"{where}: the figure did not change when moved to values "
                                f"{c['unchanged']}")
    return report


def check_phone(chromium: str, base_url: str, page: str, budget_ms: int,
                failures: list[str]) -> None:
    """The page rendered in a phone's window does not scroll sideways as a whole (a code block,
    a table or an equation may scroll inside its own box), MathJax breaks each display at the
    width of its box, and no cell of an aligned block overlaps the next."""
    try:
        dom, _ = render(chromium, f"{base_url}{PHONE_FRAME}?/{page}", budget_ms)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        failures.append(f"could not render at {PHONE}: {error}")
        return
    match = re.search(rf'<pre id="{WIDTHS_ID}"[^>]*>(.*?)</pre>', dom, re.S)
    if not match:
        failures.append(f"the width probe did not report at {PHONE}")
        return
    widths = json.loads(html.unescape(match.group(1)))
    for line in widths["page"]:
        failures.append(f"the page scrolls sideways in a {PHONE.split(',')[0]} px window, "
                        f"widened by {line!r}")
    for line in widths["measured"]:
        failures.append(f"at {PHONE.split(',')[0]} px, {line!r}")


def check_page(chromium: str, base_url: str, html_dir: Path, page: str, budget_ms: int) -> Result:
    static = StaticPage()
    static.feed((html_dir / page).read_text(encoding="utf-8"))
    result = Result(page, static)
    for url in static.remote:
        result.failures.append(f"references {url} on another host (it cannot load offline)")
    for link in sorted(set(static.local_links)):
        target = (html_dir / page).parent / link
        if link and not (target.is_file() or (target / "index.html").is_file()):
            result.failures.append(f"links to {link}, which the build does not have")
    for anchor in sorted(set(static.anchors) - static.ids):
        result.failures.append(f"links to #{anchor}, an anchor this page does not have")
    if static.search_fields != 1:
        result.failures.append(f"{static.search_fields} search fields, not one (the sidebar's): "
                               "a theme header bar holds the others (book/_ext/gaugebook_book.py "
                               "sets navbar_persistent to keep it away)")
    if static.stderr:
        result.failures.append(f"{static.stderr} cell outputs on stderr (a warning or log "
                               "message shown to readers: fix its cause)")
    start = time.monotonic()
    try:
        dom, log = render(chromium, f"{base_url}/{page}", budget_ms)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        result.failures.append(f"could not render: {error}")
        return result
    result.seconds = time.monotonic() - start
    result.console = [msg for msg, _ in CONSOLE_ERROR.findall(log)]
    match = re.search(rf'<pre id="{ERRORS_ID}"[^>]*>(.*?)</pre>', dom, re.S)
    if match:
        result.console += json.loads(html.unescape(match.group(1)))
    else:
        result.failures.append("the console recorder did not report (the page did not finish "
                               f"loading within {budget_ms} ms of virtual time?)")
    for message in dict.fromkeys(result.console):
        result.failures.append(f"JavaScript error: {message}")
    rendered = RenderedPage()
    rendered.feed(dom)
    result.rendered = rendered

    if static.math and rendered.mjx < static.math:
        result.failures.append(
            f"MathJax typeset {rendered.mjx} of {static.math} math elements"
            + (" (MathJax did not run: is _vendor/mathjax served?)" if rendered.mjx == 0 else ""))
    for error in dict.fromkeys(rendered.mjx_errors):  # each error shows in CHTML and in MathML
        result.failures.append(f"MathJax error: {error}")
    text = " ".join("".join(rendered.text).split())
    for name, pattern in RAW_TEX:
        for match in pattern.finditer(text):
            snippet = text[max(0, match.start() - 40):match.end() + 40]
            result.failures.append(f"raw TeX {name} in the visible text: ...{snippet}...")
            break
    result.interactive = check_interactive(dom, static.interactive, result.failures)
    match = re.search(rf'<pre id="{WIDTHS_ID}"[^>]*>(.*?)</pre>', dom, re.S)
    if match:
        widths = json.loads(html.unescape(match.group(1)))
        for line in widths["inputs"]:
            result.failures.append(f"a code cell scrolls sideways at 1280 px: {line!r}")
        for line in widths["outputs"]:
            result.failures.append(f"an output is wider than its column at 1280 px: {line!r}")
        for line in widths["math"]:
            result.failures.append(f"display math scrolls sideways at 1280 px: {line!r}")
        for line in widths["page"]:
            result.failures.append(f"the page scrolls sideways at 1280 px: {line!r}")
        for line in widths["measured"]:
            result.failures.append(f"at 1280 px, {line!r}")
    else:
        result.failures.append("the width probe did not report")
    check_phone(chromium, base_url, page, budget_ms, result.failures)
    images = re.findall(r'<img [^>]*src="[^"]*_images/', dom)
    link = r'<a [^>]*class="[^"]*\bgb-full-size\b[^"]*"[^>]*>'
    linked = re.findall(link + r'<img [^>]*src="[^"]*_images/', dom)
    if len(linked) < len(images):
        result.failures.append(f"{len(images) - len(linked)} of {len(images)} figures are not "
                               "links to their full-size image (did gaugebook.js run?)")
    rendered_views = sum(rendered.subareas)
    if static.widget_views and rendered_views < static.widget_views:
        result.failures.append(
            f"{rendered_views} of {static.widget_views} embedded widget views rendered"
            + (" (the embedder did not run: are require.js and jupyter-widgets/ served?)"
               if not rendered.subareas else ""))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", nargs="?", default="_build/html", type=Path)
    parser.add_argument("--chromium", help="Chromium executable (default: found on PATH)")
    parser.add_argument("--budget-ms", type=int, default=10000, help="--virtual-time-budget")
    parser.add_argument("--jobs", type=int, default=2, help="pages rendered at once")
    parser.add_argument("--pages", nargs="+", metavar="NAME",
                        help="only the pages whose path holds one of these (default: all)")
    args = parser.parse_args(argv)

    html_dir = args.html_dir.resolve()
    pages = sorted(p.relative_to(html_dir).as_posix() for p in (html_dir / "book").rglob("*.html"))
    if args.pages:
        pages = [page for page in pages if any(name in page for name in args.pages)]
    if not pages:
        print(f"check_rendered: no pages under {html_dir}/book/: build the book first "
              "(jupyter-book build .)", file=sys.stderr)
        return 1
    chromium = find_chromium(args.chromium)

    handler = functools.partial(QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(
                lambda page: check_page(chromium, base_url, html_dir, page, args.budget_ms), pages))
    finally:
        server.shutdown()

    missing = sorted({path for path, code in QuietHandler.requests
                      if code >= 400 and path.split("?")[0] != "/favicon.ico"})

    print(f"{'page':<34} {'math':>11} {'widgets':>9} {'interactive':>11}  seconds")
    for r in results:
        mjx = r.rendered.mjx if r.rendered else 0
        views = sum(r.rendered.subareas) if r.rendered else 0
        moves = sum(c["moves"] for fig in r.interactive for c in fig["controls"])
        print(f"{r.page:<34} {mjx:>5}/{r.static.math:<5} {views:>4}/{r.static.widget_views:<4} "
              f"{len(r.interactive):>2}/{r.static.interactive:<2} {moves:>4} mv "
              f"{r.seconds:6.1f}  {'ok' if not r.failures else 'FAILED'}")
    for r in results:
        for fig in r.interactive:
            controls = ", ".join(f"{c['name']} ({c['moves']} moves, "
                                 f"{c['moves'] - len(c['unchanged'])} changed)"
                                 for c in fig["controls"])
            print(f"  {r.page} {fig['id']}: {controls}")
    failed = [r for r in results if r.failures]
    if failed or missing:
        print("\ncheck_rendered: FAILED", file=sys.stderr)
        for r in failed:
            for failure in r.failures:
                print(f"  {r.page}: {failure}", file=sys.stderr)
        for path in missing:
            print(f"  the server has no {path} (requested by a page; missing from _vendor/?)",
                  file=sys.stderr)
        return 1
    print(f"\ncheck_rendered: {len(results)} pages passed (math typeset, widgets rendered, "
          "interactive figures responding, no code cell, output or equation wider than its column, "
          "no page wider than a phone's window, no network, no JavaScript error).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
