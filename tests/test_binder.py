"""Binder: ``environment.yml`` and ``postBuild`` give an environment in which the library imports.

Binder (repo2docker) installs ``environment.yml`` (conda, then its pip section) and then runs
``postBuild`` from the repository's root. The fast tests check that the pip section mirrors
``pyproject.toml``. The slow one (``make test-binder``, about two minutes) takes the same steps in
a fresh virtual environment that sees no other site-packages: the pip section (pinned by
``.ci/requirements.txt`` as CI pins everything; torch first, from the pinned CPU build, in place of
the CPU index line), then ``postBuild`` in a copy of the repository; every public module must
import and ``pip check`` must find every dependency installed.
"""
import os
import pkgutil
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import gaugebook

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / ".ci" / "requirements.txt"
TORCH = "torch==2.13.0"  # as the Makefile installs it
MODULES = sorted(f"gaugebook.{m.name}" for m in pkgutil.iter_modules(gaugebook.__path__)
                 if not m.name.startswith("_"))


def environment():
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def pip_section() -> list[str]:
    return next(d["pip"] for d in environment()["dependencies"] if isinstance(d, dict))


def test_environment_pip_section_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = project["dependencies"] + [r for extra in ("book", "dev")
                                          for r in project["optional-dependencies"][extra]]
    requirements = [r for r in pip_section() if not r.startswith("-")]
    assert sorted(requirements) == sorted(expected)


def test_environment_has_the_python_ci_uses():
    assert "python=3.11" in environment()["dependencies"]


def test_postbuild_installs_the_library_and_stops_on_errors():
    script = ROOT / "postBuild"
    assert os.access(script, os.X_OK), "postBuild must be executable"
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/bin/bash" and "set -euo pipefail" in lines
    assert "python -m pip install --no-deps -e ." in lines


def run(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert proc.returncode == 0, f"{shlex.join(map(str, cmd))}:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout


@pytest.mark.skipif(os.environ.get("GAUGEBOOK_BINDER_TEST") != "1",
                    reason="slow (about 2 minutes): run by `make test-binder`")
def test_binder_install_steps_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])  # no --system-site-packages: nothing leaks in
    python = venv / "bin" / "python"
    pip = [python, "-m", "pip", "install", "--quiet", "--no-compile", "-c", CONSTRAINTS]
    run(pip + shlex.split(os.environ.get("TORCH_PIP_ARGS", "")) + [TORCH])
    run(pip + [r for r in pip_section() if not r.startswith("--extra-index-url")])

    repo = tmp_path / "repo"  # a clone's files, so that the editable install points there
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(
        ".git", ".venv", "node_modules", "_build", "_vendor", "dist", "build", "*.egg-info",
        "__pycache__", ".pytest_cache", ".jupyter_cache"))
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    out = run(["bash", "postBuild"], cwd=repo, env=env)
    assert f"gaugebook {gaugebook.__version__} installed" in out

    run([python, "-m", "pip", "check"], env=env)
    check = ("import importlib, gaugebook; "
             f"[importlib.import_module(m) for m in {MODULES!r}]; print(gaugebook.__file__)")
    where = run([python, "-c", check], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"})
    assert Path(where.strip()).is_relative_to(repo)
