"""A run's files on disk: provenance, atomic writes, locks, and reading back what an earlier
call wrote (the trainer, :mod:`gaugebook.training`, uses these).

Every result and checkpoint is written to a temporary file in its folder, flushed and renamed
(:func:`write_json_atomic`, :func:`save_atomic`): an interrupted write never leaves half a file,
and :func:`remove_stale_temporaries` clears what one left. Each run's result is guarded by a
lock file (:func:`run_locks`), so that two processes cannot write it at once. An unreadable
file is set aside (:func:`set_aside`) and its run trained again; a readable one written with
other settings is refused (:func:`check_same_config`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gaugebook.results import read_run
from gaugebook.run_config import EXECUTION_FIELDS, RunConfig

__all__ = ["RunFileConflict", "provenance", "write_json_atomic", "save_atomic", "set_aside",
           "run_locks", "remove_stale_temporaries", "check_same_config", "checkpoint_path",
           "existing_results"]


class RunFileConflict(ValueError):
    """A result or checkpoint on disk that this call may neither skip nor resume: written for
    other settings, another time budget or an older format. The message names the file and the
    fix; the command line prints it without a traceback, whenever training meets it."""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=True).stdout.strip()


def _cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux) and its number of cores."""
    name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name or 'cpu'} ({os.cpu_count()} cores)"


def provenance(device: torch.device) -> dict:
    """Where and with what a result was produced. ``git_dirty``: tracked files differed from the
    commit (``None`` where git is unavailable and the commit comes from ``GAUGEBOOK_COMMIT``);
    ``threads``: the host threads torch used (a worker's share of them)."""
    device = torch.device(device)
    try:
        commit, dirty = _git("rev-parse", "HEAD"), bool(_git("status", "--porcelain",
                                                            "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = os.environ.get("GAUGEBOOK_COMMIT", "unknown"), None
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "hostname_platform": platform.platform(),
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_atomic(path: Path, write) -> None:
    """``write(file)`` into a temporary file in ``path``'s folder, flushed to disk, then renamed
    onto ``path``: never a half-written file, and no temporary file left on failure. A failed
    write names the path and the free space."""
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
        raise OSError(f"cannot write {path}: {error} ({free / 2**20:.1f} MiB free there)") from error
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write ``payload`` as JSON, atomically (``_write_atomic``)."""
    text = json.dumps(payload, indent=1).encode()  # fails before any file is touched
    _write_atomic(Path(path), lambda f: f.write(text))


def save_atomic(obj, path: Path) -> None:
    """``torch.save(obj)`` to ``path``, atomically (``_write_atomic``)."""
    _write_atomic(path, lambda f: torch.save(obj, f))


def set_aside(path: Path, error: Exception) -> None:
    """Move an unreadable ``path`` to ``path.corrupt`` (kept for inspection) with a warning."""
    aside = path.with_suffix(path.suffix + ".corrupt")
    os.replace(path, aside)
    warnings.warn(f"{path} is unreadable ({type(error).__name__}: {error}); moved to {aside}, "
                  "and the run starts again from its last readable state", RuntimeWarning,
                  stacklevel=3)


@contextlib.contextmanager
def run_locks(out: Path, cfgs: list[RunConfig]):
    """Hold ``<out>/<name>.lock`` for every run: a second process that would write one of these
    results fails at once, naming it, instead of overwriting it."""
    handles = []
    try:
        for cfg in cfgs:
            handle = open(out / f"{cfg.name}.lock", "a")
            handles.append(handle)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(f"another process is training {cfg.name} into {out} (it holds "
                                   f"{handle.name}): wait for it, or write to another --out"
                                   ) from None
        yield
    finally:
        for handle in handles:  # closing unlocks; the file stays, since removing a lock file
            handle.close()  # that another process has opened would let a third one in


def remove_stale_temporaries(out: Path, cfgs: list[RunConfig], batched: bool) -> None:
    """The temporary files that an interrupted write of these runs' results or of their
    checkpoint left (under the runs' locks no live process owns them); other runs' files in
    ``out`` are not touched."""
    finals = [out / f"{cfg.name}.json" for cfg in cfgs]
    if batched:  # the cohort's checkpoint is named after the runs still to train
        pending = [cfg for cfg in cfgs if not (out / f"{cfg.name}.json").exists()]
        finals += [checkpoint_path(out, group, True) for group in (cfgs, pending) if group]
    else:
        finals += [checkpoint_path(out, [cfg], False) for cfg in cfgs]
    for final in finals:
        for tmp in final.parent.glob(glob.escape(final.name) + ".tmp*"):
            tmp.unlink(missing_ok=True)


def _as_json(config: dict) -> dict:
    """``config`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(config))


def check_same_config(cfg: RunConfig, stored: dict, path: Path) -> None:
    """:class:`RunFileConflict` when ``path`` (a result or checkpoint of ``cfg.name``) was
    written for another configuration (:data:`~gaugebook.run_config.EXECUTION_FIELDS` may
    differ)."""
    expected = _as_json(dataclasses.asdict(cfg))
    try:
        stored = _as_json(dataclasses.asdict(RunConfig.from_dict(stored)))  # fills newer fields
    except (TypeError, ValueError) as error:
        raise RunFileConflict(f"{path} holds a configuration this version cannot read "
                              f"({error}): delete the file to train the run again, or write "
                              "to another --out") from None
    differing = [f"{k}: {stored[k]!r} there, {expected[k]!r} here" for k in sorted(expected)
                 if stored[k] != expected[k] and k not in EXECUTION_FIELDS]
    if differing:
        raise RunFileConflict(f"{path} holds run {cfg.name} with other settings "
                              f"({'; '.join(differing)}): write to another --out, give this run "
                              "a tag (--set tag=...), or delete the file to train the run anew")


def checkpoint_path(out: Path, cfgs: list[RunConfig], batched: bool) -> Path:
    """Where a run's checkpoint lives (``<out>/checkpoints/<name>.pt``), or a batched cohort's,
    named after its runs (``batch-<hash of their names>.pt``)."""
    if not batched:
        return out / "checkpoints" / f"{cfgs[0].name}.pt"
    names = ",".join(c.name for c in cfgs)
    return out / "checkpoints" / f"batch-{hashlib.sha1(names.encode()).hexdigest()[:12]}.pt"


def existing_results(cfgs: list[RunConfig], out: Path) -> dict[str, dict]:
    """The results in ``out`` of ``cfgs``' runs, by name; :class:`RunFileConflict` for one
    written with other settings, or cut by another time budget than ``cfg.max_wall_s`` (not the
    run asked for)."""
    found = {}
    for cfg in cfgs:
        path = out / f"{cfg.name}.json"
        if path.exists():
            try:
                result = read_run(path).data
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                set_aside(path, error)  # not JSON, or not a result record
                continue
            check_same_config(cfg, result["config"], path)
            budget = result["config"].get("max_wall_s")
            if result.get("truncated") and budget != cfg.max_wall_s:
                raise RunFileConflict(f"{path} holds run {cfg.name} cut at step "
                                      f"{result['steps_done']} by max_wall_s={budget}, not "
                                      f"{cfg.max_wall_s}: delete it to train the run again, or "
                                      "write to another --out")
            found[cfg.name] = result
    return found
