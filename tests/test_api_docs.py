"""The API appendix (``book/api/``) documents every public module, class and function, and no
private helper.

One page per public module of ``gaugebook`` (a module whose name has no leading underscore; a
subpackage such as ``gaugebook.data`` is documented through the ``__all__`` of its ``__init__``,
which is its public face), and the table of contents takes them all (a glob). The pages are built here with the book's own
``_config.yml``, strictly (``-W -n``: every cross-reference resolves), and the HTML must hold an
entry for every public class and function (a module's ``__all__``, or else the names without a
leading underscore that the module defines) and none whose name starts with an underscore.
"""
import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import gaugebook
import gaugebook.data

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "book" / "api"
MODULES = sorted(m.name for m in pkgutil.iter_modules(gaugebook.__path__)
                 if not m.name.startswith("_"))


def public_callables(module) -> set[str]:
    """The classes and functions of ``module`` that its reference must show."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    return {n for n in names if inspect.isclass(getattr(module, n))
            or inspect.isfunction(getattr(module, n))}


def test_one_page_per_public_module():
    pages = sorted(p.stem for p in API.glob("*.md") if p.stem != "index")
    assert pages == MODULES, "book/api/ needs exactly one <module>.md per public module"
    for name in MODULES:
        assert f".. automodule:: gaugebook.{name}\n" in (API / f"{name}.md").read_text()


def test_the_package_docstring_lists_every_module():
    """The API index shows the package docstring: its module list is the reader's map."""
    listed = set(re.findall(r":mod:`~gaugebook\.(\w+)`", gaugebook.__doc__))
    assert listed == set(MODULES), (f"missing: {set(MODULES) - listed}, "
                                    f"extra: {listed - set(MODULES)}")


def test_no_docstring_holds_a_control_character():
    """A LaTeX ``\\top`` or ``\\theta`` in a docstring that is not a raw string becomes a tab
    followed by ``op`` or ``heta`` on the API page."""
    bad = []
    for name in MODULES + [f"data.{m.name}" for m in pkgutil.iter_modules(gaugebook.data.__path__)]:
        module = importlib.import_module(f"gaugebook.{name}")
        objects = [module, *(v for _, v in inspect.getmembers(module)
                             if getattr(v, "__module__", None) == module.__name__)]
        for obj in objects:
            # a class's own methods (vars: inspect.getmembers would read deprecated attributes
            # of the ipywidgets base classes)
            methods = [f for f in vars(obj).values() if inspect.isfunction(f)] \
                if inspect.isclass(obj) else []
            for o in [obj, *methods]:
                if re.search(r"[\x00-\x09\x0b-\x1f]", o.__doc__ or ""):  # a tab too
                    bad.append(f"{name}.{getattr(o, '__qualname__', '')}")
    assert bad == []


def test_every_public_function_method_and_property_has_a_docstring():
    """What the API pages show: a method without a docstring of its own may inherit one from a
    class of the package (Sphinx shows the inherited text)."""
    def documented(obj, name, value) -> bool:
        f = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        return bool((f.__doc__ or "").strip()) or any(
            (getattr(getattr(base, name, None), "__doc__", None) or "").strip()
            for base in obj.__mro__[1:] if base.__module__.startswith("gaugebook"))

    bare = []
    for name in MODULES:
        module = importlib.import_module(f"gaugebook.{name}")
        for n in sorted(public_callables(module)):
            obj = getattr(module, n)
            if getattr(obj, "__module__", None) != module.__name__:
                continue  # documented in its own module
            if not inspect.getdoc(obj):
                bare.append(f"{name}.{n}")
            if inspect.isclass(obj):
                bare += [f"{name}.{n}.{m}" for m, v in vars(obj).items()
                         if not m.startswith("_") and (isinstance(v, property) or inspect.isfunction(
                             getattr(v, "__func__", v))) and not documented(obj, m, v)]
    assert bare == []


def test_the_table_of_contents_lists_the_appendix():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    appendices = next(p for p in toc["parts"] if p["caption"] == "Appendices")["chapters"]
    entry = next(c for c in appendices if c.get("file") == "book/api/index")
    assert entry["sections"] == [{"glob": "book/api/*"}]


@pytest.fixture(scope="module")
def built_api(tmp_path_factory):
    """``book/api`` built alone with the book's configuration, as the strict build does."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    if not jupyter_book.exists():
        pytest.skip("jupyter-book is not installed (the [book] extra)")
    site = tmp_path_factory.mktemp("api-book")
    shutil.copytree(API, site / "book" / "api")
    shutil.copytree(ROOT / "book" / "_ext", site / "book" / "_ext")  # _config.yml's extension
    shutil.copy(ROOT / "book" / "references.bib", site / "book")
    shutil.copy(ROOT / "_config.yml", site)
    (site / "_vendor").mkdir()  # the served JavaScript is not needed to check the text
    (site / "_toc.yml").write_text("format: jb-book\nroot: book/api/index\nchapters:\n"
                                   + "".join(f"  - file: book/api/{m}\n" for m in MODULES))
    proc = subprocess.run([str(jupyter_book), "build", ".", "-W", "-n", "--keep-going"],
                          cwd=site, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return site / "_build" / "html" / "book" / "api"


def reexports(module) -> dict[str, str]:
    """The public callables that ``module`` re-exports from another module, with their homes."""
    return {n: getattr(module, n).__module__ for n in public_callables(module)
            if getattr(module, n).__module__ != module.__name__}


@pytest.mark.parametrize("name", MODULES)
def test_every_public_name_is_documented_once_and_no_private_one(built_api, name):
    """A public name has an entry on its home module's page; a re-export (``RunConfig`` in
    ``gaugebook.experiment``) has a link to it there, not a second entry."""
    html = (built_api / f"{name}.html").read_text(encoding="utf-8")
    entries = set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', html))
    module = importlib.import_module(f"gaugebook.{name}")
    homes = {} if name == "data" else reexports(module)  # data: one page for its submodules
    missing = {n for n in public_callables(module) - set(homes)
               if f"gaugebook.{name}.{n}" not in entries}
    assert not missing, f"gaugebook.{name}: no entry for {sorted(missing)}"
    twice = sorted(n for n in homes if f"gaugebook.{name}.{n}" in entries)
    assert not twice, f"gaugebook.{name} documents re-exports again: {twice} (exclude-members)"
    unlinked = sorted(n for n, home in homes.items()
                      if f'href="{home.removeprefix("gaugebook.")}.html#{home}.{n}"' not in html)
    assert not unlinked, f"gaugebook.{name}: no link to the home of {unlinked}"
    private = sorted(e for e in entries if any(part.startswith("_") for part in e.split(".")))
    assert not private, f"private names in the reference: {private}"
