"""Bring what one call of ``benchmarks/gpu_session.sh`` returned into the repository.

    python benchmarks/collect_gpu_call.py FILES_AT [--date 2026-12-05]

``FILES_AT`` is the folder the device tool copied ``$OUT`` to. The script

1. writes the result files of ``paper.tar`` (and ``paper_lr.tar``) into
   ``results/gpu/<preset>/``, each checked as a result record
   (:meth:`gaugebook.results.Run.from_dict`). It never replaces a complete run by a truncated
   one nor a cut run by one cut earlier, and never copies a failed run's ``*.error.json``
   there (:func:`gaugebook.results.load_runs` refuses a folder that holds one): those go to
   the logs;
2. copies the logs (``paper.log`` with one progress line per 1,000 steps, ``grid.log``,
   ``gpu_tests.txt``, ``gpu_utilisation.csv``, ...) into a new ``results/gpu/logs-<date>/``
   (``logs-<date>b``, ``c``, ... when that exists);
3. copies the grid benchmark, named after the chip, into ``benchmarks/results/``:
   ``grid_h200.json`` (complete) under that name when none is recorded yet, otherwise, like a
   cut one (``grid_h200_partial.json``) and the optimizer-step stage (``grid_h200_steps.json``),
   under a name dated like the logs' folder; it never overwrites;
4. prints what ``results/gpu/paper`` now holds and the pre-registered rule on its complete arms.

It writes nothing else (the READMEs and the changelog are for the person who ran the call).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
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
    """``text`` with its progress bars thinned (tqdm redraws a bar with carriage returns): between
    two other lines (a message, a bar restarted by a retry), each bar keeps the first line of
    each :data:`EVERY` steps and its last line, so that where a cut run stopped stays; every
    other line is kept."""
    kept: list[str] = []
    bars: list[tuple[str, int, str]] = []  # the progress lines since the last other line

    def flush():
        last = {label: i for i, (label, _, _) in enumerate(bars)}
        seen = set()
        for i, (label, bucket, line) in enumerate(bars):
            if (label, bucket) not in seen or last[label] == i:
                kept.append(line)
            seen.add((label, bucket))
        bars.clear()

    for line in re.split(r"[\r\n]+", text):
        match = PROGRESS.search(line)
        if match is not None:
            done, total = map(int, match.groups())
            bars.append((line.split(":")[0], done // EVERY if done < total else -1, line))
        elif line.strip():
            flush()
            kept.append(line)
    flush()
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
            if target.exists():
                old = json.loads(target.read_text())
                if not old.get("truncated") and data["truncated"]:
                    done.append(f"kept complete {path} (the call's is cut)")
                    continue
                if old.get("truncated") and data["truncated"] \
                        and old["steps_done"] >= data["steps_done"]:
                    done.append(f"kept {path} cut at step {old['steps_done']} (the call's is "
                                f"cut at {data['steps_done']})")
                    continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(data, indent=1) + "\n")
            state = "truncated" if data["truncated"] else "complete"
            done.append(f"{path}: {state} at step {run.last_step}")
    return done


def new_folder(parent: Path, stem: str) -> Path:
    """``parent/stem``, or ``stemb``, ``stemc``, ... for the first that does not exist."""
    for suffix in ["", *"bcdefghijklmnopqrstuvwxyz"]:
        if not (parent / f"{stem}{suffix}").exists():
            return parent / f"{stem}{suffix}"
    raise FileExistsError(f"{parent}/{stem}*: no free name")


BENCHMARK = re.compile(r"grid_([a-z0-9]+)(_partial|_steps)?\.json")  # grid_<chip>[_stage].json


def benchmark_targets(files_at: Path, bench: Path, tag: str) -> dict[Path, Path]:
    """``{file of the call: where it goes}`` for the grid benchmark's files. gpu_session.sh
    names them after the chip (``h100``, ``h200``): a complete benchmark ``grid_h200.json``, a
    cut one ``grid_h200_partial.json``, the optimizer steps ``grid_h200_steps.json``; a
    complete one becomes ``benchmarks/results/grid_h200.json`` unless one is recorded, and every
    other file a name with the call's ``tag`` (its date, and b, c, ... for later calls that
    day). FileExistsError, before anything is written, when a target exists."""
    targets = {}
    for source in sorted(files_at.glob("grid_*.json")):
        name = BENCHMARK.fullmatch(source.name)
        if not name:
            continue
        target = bench / f"{source.stem}_{tag}.json"
        if not name.group(2) and not (bench / source.name).exists():  # complete, first recorded
            target = bench / source.name
        if target.exists():
            raise FileExistsError(f"{target} exists: move it or pass another --date")
        targets[source] = target
    return targets


def collect(files_at: Path, root: Path, date: str) -> list[str]:
    """Everything above, from ``files_at`` into the repository at ``root``; returns the report."""
    files_at = Path(files_at)
    if not files_at.is_dir():
        raise FileNotFoundError(f"no folder {files_at}: pass the folder the device tool copied "
                                "the call's files to (files_at)")
    logs = new_folder(root / "results" / "gpu", f"logs-{date}")
    bench = benchmark_targets(files_at, root / "benchmarks" / "results",
                              logs.name.removeprefix("logs-"))
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
    for source, target in bench.items():
        shutil.copyfile(source, target)
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
    except (FileNotFoundError, FileExistsError) as error:
        parser.error(str(error))
    print("\n".join(report))
    from gaugebook.decision_plots import recorded_paper_arms
    from gaugebook.results import decisions

    os.chdir(args.root)  # the status of this repository's results, found from here first
    runs, status = recorded_paper_arms()
    print(f"results/gpu/paper: {status}")
    for verdict in decisions(runs):
        print(verdict.sentence())


if __name__ == "__main__":
    main()
