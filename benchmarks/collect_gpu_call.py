"""Bring what one call of ``benchmarks/gpu_session.sh`` returned into the repository.

    python benchmarks/collect_gpu_call.py FILES_AT [--date 2026-12-05]

``FILES_AT`` is the folder the device tool copied ``$OUT`` to. The script

1. writes the result files of ``paper.tar`` (and ``paper_lr.tar``) into ``results/gpu/<preset>/``,
   each checked as a result record (:meth:`gaugebook.results.Run.from_dict`). It never replaces
   a complete run by a truncated one, and never copies a failed run's ``*.error.json`` there
   (:func:`gaugebook.results.load_runs` refuses a folder that holds one): those go to the logs;
2. copies the logs (``paper.log`` with one progress line per 1,000 steps, ``grid.log``,
   ``gpu_tests.txt``, ``gpu_utilisation.csv``, ...) into a new ``results/gpu/logs-<date>/``
   (``logs-<date>b``, ``c``, ... when that exists);
3. copies the grid benchmark into ``benchmarks/results/``: a complete ``grid_h200.json`` (it has
   the ``"bias"`` stage) under that name, a cut one and the optimizer-step stage under dated names;
4. prints what ``results/gpu/paper`` now holds and the pre-registered rule on its complete arms.

It writes nothing else (the READMEs and the changelog are for the person who ran the call).
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gaugebook.results import Run  # noqa: E402

RESULT_TARS = ("paper.tar", "paper_lr.tar")
LOGS = ("paper.log", "paper_lr.log", "grid.log", "gpu_tests.txt", "gpu_utilisation.csv")
PROGRESS = re.compile(r"\|\s*(\d+)/(\d+) \[")  # a tqdm line: "label: 4%|... | 1000/28000 [..."
EVERY = 1000  # progress lines kept: the first one of each 1,000 steps, per bar


def condense(text: str) -> str:
    """``text`` with the progress bars' repeated lines thinned to the first line of each
    :data:`EVERY` steps of each bar, and its last line (tqdm redraws a bar with carriage
    returns); every other line is kept."""
    kept, last = [], {}  # bar label -> (bucket kept last, index of its last line in kept)
    for line in re.split(r"[\r\n]+", text):
        match = PROGRESS.search(line)
        if not line.strip():
            continue
        if match is None:
            kept.append(line)
            continue
        label = line.split(":")[0]
        done, total = map(int, match.groups())
        bucket = done // EVERY if done < total else -1  # the end is always kept
        if label in last and last[label][0] == bucket:
            continue
        last[label] = (bucket, len(kept))
        kept.append(line)
    return f"# condensed: one progress line per {EVERY:,} steps\n" + "\n".join(kept) + "\n"


def results_from(tar_path: Path, results: Path, errors: Path) -> list[str]:
    """Write the result files of ``tar_path`` (``<preset>/<run>.json``) into
    ``results/<preset>/``; failed runs' error files into ``errors``. Returns what was done, one
    line per file."""
    done = []
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            path = Path(member.name)
            if not member.isfile() or path.suffix != ".json" or len(path.parts) != 2:
                continue  # folders; checkpoints and lock files are never packed
            data = json.load(tar.extractfile(member))
            if path.name.endswith(".error.json"):
                errors.mkdir(parents=True, exist_ok=True)
                (errors / f"{path.parts[0]}-{path.name}").write_text(json.dumps(data, indent=1))
                done.append(f"failed run {path}: error kept in {errors.name}/")
                continue
            run = Run.from_dict(data, path)
            target = results / path
            if target.exists() and not json.loads(target.read_text())["truncated"] \
                    and data["truncated"]:
                done.append(f"kept complete {target.relative_to(results)} (the call's is cut)")
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(data, indent=1) + "\n")
            state = "truncated" if data["truncated"] else "complete"
            done.append(f"{target.relative_to(results)}: {state} at step {run.last_step}")
    return done


def new_folder(parent: Path, stem: str) -> Path:
    """``parent/stem``, or ``stemb``, ``stemc``, ... for the first that does not exist."""
    for suffix in ["", *"bcdefghijklmnopqrstuvwxyz"]:
        if not (parent / f"{stem}{suffix}").exists():
            return parent / f"{stem}{suffix}"
    raise FileExistsError(f"{parent}/{stem}*: no free name")


def collect(files_at: Path, root: Path, date: str) -> list[str]:
    """Everything above, from ``files_at`` into the repository at ``root``; returns the report."""
    files_at = Path(files_at)
    if not files_at.is_dir():
        raise FileNotFoundError(f"no folder {files_at}: pass the folder the device tool copied "
                                "the call's files to (files_at)")
    logs = new_folder(root / "results" / "gpu", f"logs-{date}")
    report = []
    for name in RESULT_TARS:
        if (files_at / name).is_file():
            report += results_from(files_at / name, root / "results" / "gpu", logs / "errors")
    for name in LOGS:
        source = files_at / name
        if source.is_file():
            logs.mkdir(parents=True, exist_ok=True)
            text = source.read_text(errors="replace")
            (logs / name).write_text(condense(text) if name.endswith(".log") else text)
            report.append(f"{logs.relative_to(root)}/{name}")
    bench = root / "benchmarks" / "results"
    grid = files_at / "grid_h200.json"
    if grid.is_file():
        complete = "bias" in json.loads(grid.read_text())
        target = bench / ("grid_h200.json" if complete else f"grid_h200_partial_{date}.json")
        shutil.copyfile(grid, target)
        report.append(f"{target.relative_to(root)}{'' if complete else ' (cut short)'}")
    for name, stem in (("grid_h200_partial.json", "grid_h200_partial"),
                       ("grid_steps.json", "grid_h200_steps")):
        if (files_at / name).is_file():
            target = bench / f"{stem}_{date}.json"
            shutil.copyfile(files_at / name, target)
            report.append(f"{target.relative_to(root)}")
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files_at", type=Path, help="the folder of the call's files")
    parser.add_argument("--date", default=datetime.date.today().isoformat(),
                        help="the call's date, in the names of the logs and benchmark files")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        report = collect(args.files_at, args.root, args.date)
    except FileNotFoundError as error:
        parser.error(str(error))
    print("\n".join(report))
    from gaugebook.decision_plots import recorded_paper_arms
    from gaugebook.results import decisions

    runs, status = recorded_paper_arms(extra_roots=[args.root])
    print(f"results/gpu/paper: {status}")
    for verdict in decisions(runs):
        print(verdict.sentence())


if __name__ == "__main__":
    main()
