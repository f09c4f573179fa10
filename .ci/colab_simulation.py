#!/usr/bin/env python3
"""Run Colab-edition chapters the way a Colab reader does, on this machine (``make test-colab``).

Usage: python .ci/colab_simulation.py [CHAPTER ...] [--repo PATH] [--keep]

CHAPTER names notebooks of ``book/colab/`` (default: one from each Part, the second reading the
recorded results). What Colab is, and what stands in for it here:

* a Python with only what Colab preinstalls that matters to the book: a fresh virtual
  environment with ``torch==2.13.0``, ``numpy``, ``matplotlib`` and ``ipykernel`` (pinned by
  ``.ci/requirements.txt``, which also pins what the install cell pulls in);
* ``google.colab`` imported when the kernel starts: a stand-in module on ``PYTHONPATH`` and an
  IPython start-up file, so the install cell takes its Colab branch;
* GitHub: a bare clone of ``--repo`` (default: this checkout) whose tag ``v<release>`` is set to
  its ``HEAD``, and a git configuration (``url.<clone>.insteadOf``) that sends
  ``https://github.com/gaugebook/gaugebook`` there. The install cell's ``%pip install
  "gaugebook @ git+https://github.com/gaugebook/gaugebook@v<release>"`` runs unchanged, builds a
  wheel and installs it; nothing of the checkout is on the path;
* ``/content``: a temporary folder outside the repository, where the notebooks run.

Before running, the edition must need no checkout (no ``git clone`` in its code). After each
chapter a last cell checks that ``gaugebook`` was imported from the installed wheel of the
pinned release. Exit status 0 when every chapter ran without error; what is committed, not
what is uncommitted, is what gets installed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
EDITION = ROOT / "book" / "colab"
REPOSITORY = "https://github.com/gaugebook/gaugebook"
DEFAULT_CHAPTERS = ["02_definition", "20_significance"]
PREINSTALLED = ["torch==2.13.0", "numpy", "matplotlib", "ipykernel"]
KERNEL = "colab-simulation"
CELL_TIMEOUT_S = 900

CHECK_CELL = """\
import importlib.metadata, sys
from pathlib import Path
import gaugebook
assert "google.colab" in sys.modules
where = Path(gaugebook.__file__).resolve()
assert Path(sys.prefix).resolve() in where.parents, f"gaugebook imported from {{where}}"
assert importlib.metadata.version("gaugebook") == gaugebook.__version__ == {release!r}
print(f"gaugebook {{gaugebook.__version__}} from {{where.parent}}")
"""


def release() -> str:
    text = (ROOT / "gaugebook" / "__init__.py").read_text()
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


def run(*args, quiet=False, **kwargs):
    """Run a command; with ``quiet``, show its output only when it fails."""
    if not quiet:
        return subprocess.run(args, check=True, **kwargs)
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise subprocess.CalledProcessError(done.returncode, args)
    return done


def needs_checkout(nb) -> list[str]:
    """Code lines that clone the repository: a Colab reader would need a checkout."""
    return [line.strip() for cell in nb.cells if cell.cell_type == "code"
            for line in cell.source.splitlines() if re.search(r"\bgit\s+clone\b", line)]


def make_colab(tmp: Path, repo: Path, version: str) -> dict:
    """The stand-in Colab under ``tmp``; returns the kernel's environment."""
    start = time.perf_counter()
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    py = venv / "bin" / "python"
    torch_args = os.environ.get("TORCH_PIP_ARGS", "").split()
    run(str(py), "-m", "pip", "install", "-q", "-c", str(ROOT / ".ci/requirements.txt"),
        *torch_args, *PREINSTALLED, quiet=True)
    found = subprocess.run([str(py), "-c", "import importlib.util as u; "
                            "print(u.find_spec('gaugebook') is None)"],
                           capture_output=True, text=True, check=True, cwd=tmp)
    assert found.stdout.strip() == "True", "gaugebook must not be installed before the install cell"
    print(f"[colab-sim] virtual environment: {time.perf_counter() - start:.0f} s")

    mirror = tmp / "github" / "gaugebook.git"
    run("git", "clone", "-q", "--bare", str(repo), str(mirror))
    run("git", "-C", str(mirror), "tag", "-f", f"v{version}", "HEAD", quiet=True)
    gitconfig = tmp / "gitconfig"
    gitconfig.write_text(f'[url "file://{mirror}"]\n\tinsteadOf = {REPOSITORY}\n')

    stub = tmp / "colab_stub" / "google" / "colab"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('"""Stand-in for Colab\'s google.colab (simulation)."""\n')
    startup = tmp / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text("import google.colab  # as Colab's kernel does\n")
    run(str(py), "-m", "ipykernel", "install", "--prefix", str(tmp / "jupyter"), "--name", KERNEL,
        quiet=True)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update({
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(tmp / "colab_stub"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "JUPYTER_PATH": str(tmp / "jupyter" / "share" / "jupyter"),
        "GIT_CONFIG_GLOBAL": str(gitconfig), "GIT_CONFIG_NOSYSTEM": "1",
        "PIP_CONSTRAINT": str(ROOT / ".ci/requirements.txt"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    })
    return env


def load_chapter(name: str):
    """The Colab notebook ``name``, refused when it would need a checkout of the repository."""
    nb = nbformat.read(EDITION / f"{name}.ipynb", as_version=4)
    clones = needs_checkout(nb)
    if clones:
        raise SystemExit(f"[colab-sim] {name} clones the repository ({clones[0]!r}): the results "
                         "it reads must reach Colab with the package")
    return nb


def run_chapter(name: str, nb, content: Path, env: dict, version: str) -> float:
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_CELL.format(release=version)))
    start = time.perf_counter()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                       resources={"metadata": {"path": str(content)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        nbformat.write(nb, content / f"{name}.ipynb")
    seconds = time.perf_counter() - start
    print(f"[colab-sim] {name}: ran in {seconds:.0f} s; {nb.cells[-1].outputs[-1]['text'].strip()}")
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", default=DEFAULT_CHAPTERS)
    parser.add_argument("--repo", type=Path, default=ROOT,
                        help="the git repository Colab installs from (default: this checkout)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    version = release()
    notebooks = {name: load_chapter(name) for name in args.chapters}
    tmp = Path(tempfile.mkdtemp(prefix="colab-sim-"))
    assert ROOT not in tmp.parents
    try:
        env = make_colab(tmp, args.repo.resolve(), version)
        content = tmp / "content"
        content.mkdir()
        for name, nb in notebooks.items():
            run_chapter(name, nb, content, env, version)
    finally:
        if args.keep:
            print(f"[colab-sim] kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"[colab-sim] passed: {', '.join(args.chapters)} (gaugebook v{version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
