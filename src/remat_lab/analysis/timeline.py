"""Memory over the program: live bytes at each instruction of XLA's schedule, and what holds the peak.

This module finds XLA's dump of a compile (the step's own, a kept copy, or an uncached compile)
and keeps it; ``timeline_parse`` reads it.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import jax
from jax.experimental.compilation_cache import compilation_cache

from remat_lab.analysis import hlotext
from remat_lab.analysis.timeline_parse import MAX_POINTS, PHASES, _downsample, parse_dump
from remat_lab.program import backend
from remat_lab.program.analysis_compile import ANALYSIS_ONLY

__all__ = ["MAX_POINTS", "PHASES", "Dump", "_downsample", "clean_stale_dump_folders", "compile_dumped",
           "memory_timeline", "parse_dump", "uncached"]

# One uncached compile at a time: each saves and restores the process-wide cache switch.
_UNCACHED_LOCK = threading.Lock()


@contextmanager
def uncached():
    """Compile with JAX's persistent cache off: a cache hit compiles nothing and dumps nothing."""
    with _UNCACHED_LOCK:
        was = jax.config.jax_enable_compilation_cache
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()  # JAX remembers "cache used" per process: make it ask again
        try:
            yield
        finally:
            jax.config.update("jax_enable_compilation_cache", was)
            compilation_cache.reset_cache()


def _read(folder: str, suffix: str) -> str | None:
    # One module per compile; with several (e.g. a GPU's extra kernels) the largest is the step.
    paths = sorted(glob.glob(os.path.join(folder, f"*{suffix}")), key=os.path.getsize)
    if not paths:
        return None
    with open(paths[-1]) as f:
        return f.read()


def _note(doc: dict, compiled) -> str:
    at, xla_bytes = doc.pop("_xla_live_range_peak")
    text = (f"Live bytes count each buffer slice once while a value in it is live, over XLA's schedule of "
            f"{doc['instructions']} instructions (loop bodies appear once). ")
    if xla_bytes is not None:
        text += (f"XLA's own live-range peak is {xla_bytes} bytes at instruction {at}: it counts every value "
                 f"at its defining instruction's size (a tuple element as the tuple's pointer table). ")
    try:
        ma = compiled.memory_analysis()
        peak = (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
                + ma.temp_size_in_bytes + ma.generated_code_size_in_bytes)
        gap = peak - doc["peak_live_bytes"]
        text += (f"memory.peak_bytes ({peak} bytes) counts allocations instead: arguments + outputs + "
                 f"the temp allocation, which is reserved for the whole program and packs values whose "
                 f"lives do not overlap; it is {abs(gap)} bytes {'above' if gap >= 0 else 'below'} the "
                 f"live peak ({doc['peak_live_bytes']} bytes)"
                 + (": the gaps the packing leaves." if gap >= 0 else
                    ": the live count includes constants, which are no argument, output or temp."))
    except Exception:  # some backends have no memory analysis
        pass
    return text


@dataclass(frozen=True)
class Dump:
    """XLA's text dump of one compile, as ``parse_dump`` reads it."""

    live_range: str
    assignment: str
    hlo: str


def compile_dumped(lowered: jax.stages.Lowered, *, read_only: bool = False):
    """``lowered.compile()`` with XLA's dump on, read and deleted: ``(compiled, Dump | None)``;
    ``read_only``: a program never run, compiled with ``analysis_compile.ANALYSIS_ONLY``.

    The dump is None when nothing was compiled (a persistent-cache hit) or the backend wrote none.
    The dump options are not part of JAX's cache key, so caching is unaffected. The folder is named
    for this process (``remat_lab_timeline_<pid>_…``) so a later process removes it if this one is
    killed mid-compile (``clean_stale_dump_folders``, once per process, here).
    """
    if not _CLEANED:
        _CLEANED.append(clean_stale_dump_folders())
    folder = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}_")
    try:
        options = {**(ANALYSIS_ONLY if read_only else {}), "xla_dump_to": folder}
        compiled = lowered.compile(compiler_options=options)
        live_range = _read(folder, "after_optimizations-live-range.txt")
        assignment = _read(folder, "after_optimizations-buffer-assignment.txt")
        hlo = _read(folder, "after_optimizations.txt")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if live_range is None or assignment is None:
        return compiled, None
    return compiled, Dump(live_range, assignment, hlo or "")


_TMP_PREFIX = "remat_lab_timeline_"
_TMP_NAME = re.compile(rf"^{_TMP_PREFIX}(\d+)_")
_LEGACY_AGE_S = 6 * 3600  # folders named before the pid was in the name: removed when this old
_CLEANED: list[int] = []


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, as another user
        return True
    return True


def clean_stale_dump_folders(folder: str | None = None) -> int:
    """Remove XLA dump folders (``compile_dumped``'s) left in the temp folder by killed processes:
    those named for a process that is gone, and unnamed ones older than six hours; how many."""
    folder = folder or tempfile.gettempdir()
    removed = 0
    for path in glob.glob(os.path.join(glob.escape(folder), f"{_TMP_PREFIX}*")):
        m = _TMP_NAME.match(os.path.basename(path))
        try:
            if m and sys.platform != "win32":  # Windows' os.kill would end the process
                stale = not _alive(int(m.group(1)))
            else:
                stale = time.time() - os.path.getmtime(path) > _LEGACY_AGE_S
        except OSError:
            continue
        if stale and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


# Dumps kept by the compiled program's text: a persistent-cache hit compiles nothing and dumps
# nothing, so without these every new session would compile an uncached copy for the timeline.
_DUMPS: dict[str, Dump] = {}
_DUMPS_KEPT = 16  # a dump's texts are up to a few MiB for deep loop stacks: keep a few
_DUMP_DIR = "timeline_dumps"  # beside the persistent compilation cache, gzip-compressed JSON
DUMPS_MAX_ENV = "REMAT_LAB_DUMPS_MAX_BYTES"
DUMPS_MAX_BYTES = 64 << 20  # least recently used out; ~5-60 KB per small configuration


def _dump_key(compiled) -> str | None:
    """The program text, op_names kept, less where the Python source was (which differs between
    processes): equal keys, equal dumps."""
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001 - a backend without program text: no reuse
        return None
    text = hlotext.without_stack_frames(hlotext.without_source_tables(text))
    return hashlib.sha256(text.encode()).hexdigest()


def _dump_path(key: str) -> str | None:
    """Where a dump is kept on disk: in the persistent compilation cache's directory, if it is on."""
    folder = jax.config.jax_compilation_cache_dir
    return os.path.join(folder, _DUMP_DIR, f"{key}.json.gz") if folder else None


def _keep_dump(key: str | None, dump: Dump) -> None:
    if key is None:
        return
    if len(_DUMPS) >= _DUMPS_KEPT:
        _DUMPS.pop(next(iter(_DUMPS)))
    _DUMPS[key] = dump
    path = _dump_path(key)
    if path is None or os.path.exists(path):
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:  # the cache directory only (REMAT_LAB_CACHE_DIR)
            f.write(gzip.compress(json.dumps(asdict(dump)).encode()))
        os.replace(tmp, path)
        backend.prune(os.path.dirname(path), backend.byte_limit(DUMPS_MAX_ENV, DUMPS_MAX_BYTES),
                      ("*.json.gz", "*.tmp"))
    except OSError:  # a read-only or full cache directory: the in-process copy still serves
        pass


def _find_dump(key: str | None) -> Dump | None:
    if key is None:
        return None
    if key in _DUMPS:
        return _DUMPS[key]
    path = _dump_path(key)
    if path is None or not os.path.exists(path):
        return None
    try:
        os.utime(path)  # used now: the last to go when the dumps are pruned
        with open(path, "rb") as f:
            fields = json.loads(gzip.decompress(f.read()))
        dump = Dump(fields["live_range"], fields["assignment"], fields["hlo"])
    except (OSError, ValueError, KeyError, TypeError):  # damaged: compile a copy instead
        return None
    _DUMPS[key] = dump
    return dump


def memory_timeline(lowered: jax.stages.Lowered, *, compiled=None, dump: Dump | None = None,
                    depth: int = 1, names: Sequence[str] = (), paths: Sequence[str] = (),
                    max_points: int = MAX_POINTS, witness: str | None = None) -> dict:
    """The memory timeline of ``lowered``'s compiled program (``run --json``'s ``memory_timeline``).

    ``compiled`` and ``dump`` from ``compile_dumped`` reuse the step's own compile; without a dump
    (a persistent-cache hit dumps nothing) the dump of an earlier compile of the same program text
    is used (kept in-process and, when the persistent cache is on, beside it on disk), else a copy is
    compiled with the cache off. ``depth``,
    ``names`` (the model's ``checkpoint_name`` tags) and ``paths`` (the parameter leaves' paths,
    ``Problem.paths``) label the buffers. When the backend writes no live-range dump (or one this
    parser cannot read) the result is ``{"source": None, "reason": ...}``.
    """
    key = _dump_key(compiled) if compiled is not None else None
    if dump is not None:
        _keep_dump(key, dump)
    else:
        dump = _find_dump(key)  # the dump of an earlier compile of this very program
    if dump is None:
        try:
            with uncached():
                compiled, dump = compile_dumped(lowered)
            if dump is not None:
                _keep_dump(_dump_key(compiled), dump)
        except Exception as err:  # XlaRuntimeError and friends: the step itself ran, so say why here
            return {"source": None, "reason": f"the uncached copy failed to compile ({type(err).__name__})"}
    if dump is None:
        return {"source": None, "reason": f"the {jax.default_backend()} backend wrote no live-range dump"}
    try:
        doc = parse_dump(dump.live_range, dump.assignment, dump.hlo, depth=depth, names=names,
                         paths=paths, max_points=max_points, witness=witness)
    except (ValueError, KeyError, IndexError) as err:  # a dump format this parser does not know
        return {"source": None, "reason": f"XLA's dump could not be read ({type(err).__name__}: {err})"}
    # The same text whichever compile the dump came from: a result is reproducible across processes.
    doc["note"] = _note(doc, compiled)
    return doc
