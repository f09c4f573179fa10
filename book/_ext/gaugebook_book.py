"""What the book's pages need beyond the theme (a Sphinx extension; ``_config.yml`` loads it).

* The launch buttons name the release. Colab, Binder and Thebe (live code) open the git tag
  ``v<version>`` of ``gaugebook.__version__``, the one home of the version; Colab opens the
  chapter's Colab edition, ``book/colab/<chapter>.ipynb``, which Colab shows like the page.
* Each inline script once. sphinx-thebe adds its configuration script (``const THEBE_JS_URL =
  ...``) after the HTML builder has started; Sphinx 7 then writes it into every page twice, and
  the second copy fails with "Identifier 'THEBE_JS_URL' has already been declared".
* A valid colour mode. pydata-sphinx-theme's layout starts a first visit in the mode
  ``{{ default_mode }}``, a template variable that nothing sets: the empty mode makes its script
  log "Got invalid theme mode: . Resetting to auto." (a console error) on every page. The pages
  start in ``auto`` (the reader's system setting), which the script would fall back to anyway.
* One search field, in the sidebar. pydata-sphinx-theme 0.17 puts a search field in its
  header bar unless the book's own options set ``navbar_persistent`` (sphinx-book-theme's
  empty default does not count): every page then opened with a bar holding nothing else.
* Code that fits. ``static/gaugebook.css`` sets the size of code and outputs at which the book's
  88-column lines fit the text column of a 1280 px window; on a phone, long inline math and
  code scroll or wrap instead of being cut at the column's edge.
* Figures at full size. ``figure_files`` links each figure to its 300-dpi PNG, and
  ``static/gaugebook.js`` every other image to itself, which a phone reader can open when the
  column shrinks it.
* Display equations on a phone. ``static/mathjax_displays.js`` tells MathJax where a display
  wider than the column may break (between formulas, at a relation or operator of its top
  level) and lets one holding a table scroll instead; it must run after the page's MathJax
  configuration, which it extends, and before MathJax, which Sphinx loads deferred.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath

import gaugebook

COLAB_EDITION = "book/colab"


def release_tag() -> str:
    return f"v{gaugebook.__version__}"


def launch_release(app, config) -> None:
    """Launch buttons and Thebe use the branch the theme is given: make it the release tag."""
    config.html_theme_options["repository_branch"] = release_tag()


def no_header_bar(app, config) -> None:
    """No theme header bar: its one item, the search field, is in the sidebar already."""
    config.html_theme_options.setdefault("navbar_persistent", [])


def colab_edition(app, pagename, templatename, context, doctree) -> None:
    """The Colab button of chapter ``book/<name>`` opens ``book/colab/<name>.ipynb``."""
    chapter = f"/{pagename}.ipynb"
    edition = f"/{COLAB_EDITION}/{PurePosixPath(pagename).name}.ipynb"
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if group.get("label") == "launch-buttons" else []:
            if button.get("text") == "Colab" and button["url"].endswith(chapter):
                button["url"] = button["url"][: -len(chapter)] + edition


def each_script_once(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated scripts: an inline script registered as ``None`` and again as ``""``."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", script) or "", getattr(script, "priority", None),
               tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"][:] = unique


def default_mode(app, pagename, templatename, context, doctree) -> None:
    """Start a first visit in the ``auto`` colour mode (the theme leaves the mode empty)."""
    context["default_mode"] = context.get("default_mode") or "auto"


def add_static(app, config) -> None:
    """Serve ``static/`` (the book's style sheet and script) with the theme's static files."""
    config.html_static_path.append(str(Path(__file__).parent / "static"))


def setup(app):
    app.connect("config-inited", launch_release)
    app.connect("config-inited", no_header_bar)
    app.connect("config-inited", add_static)
    app.add_css_file("gaugebook.css")
    app.add_js_file("gaugebook.js")
    # Sphinx writes the MathJax configuration and the deferred MathJax script at priority 500
    app.add_js_file("mathjax_displays.js", priority=501)
    app.connect("html-page-context", colab_edition, priority=510)  # after the theme's (501)
    app.connect("html-page-context", each_script_once, priority=900)
    app.connect("html-page-context", default_mode)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
