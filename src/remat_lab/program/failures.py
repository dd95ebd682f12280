"""A failure named for what it is: the device's memory, the host's, XLA's error and its code, the lab's bug.

Each kind is its own ``ExecutionError`` subclass, so the CLI gives each its own exit status
(``cli.common.STATUS``) and the app its own sentence; "a smaller configuration" is said only where
that is the cure (out of memory). XLA's message is quoted by its first line, with its status
(``RESOURCE_EXHAUSTED``, ``INTERNAL``, ...) and, where libtpu gives one, its error code
(``E1000 CompileTimeHbmOom``, documented at openxla.org/xla/errors).
"""

from __future__ import annotations

import re
import traceback

_CODE = re.compile(r"\b(E\d{3,5}):?\s+([A-Z][A-Za-z0-9]+)\b")
_STATUS = re.compile(r"^([A-Z][A-Z_]{3,}):\s")
_HOST = ("bad_alloc", "cannot allocate memory", "out of host memory")


class ExecutionError(RuntimeError):
    """XLA failed to compile or run a configuration; the message says what to change."""


class DeviceOutOfMemory(ExecutionError):
    """The program does not fit the device's memory (XLA's or libtpu's ``RESOURCE_EXHAUSTED``)."""


class HostOutOfMemory(ExecutionError):
    """This machine's own memory ran out (Python's ``MemoryError``, C++'s ``bad_alloc``), not the device's."""


class CompilerError(ExecutionError):
    """XLA (or libtpu) refused or failed the program for a reason other than memory."""


class LabBug(ExecutionError):
    """An error in Remat Lab's own code: not the configuration's, not XLA's."""


def first_line(err: BaseException) -> str:
    """``err``'s first line, at most 300 characters (its type's name when it has no text)."""
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def error_code(err: BaseException) -> str | None:
    """libtpu's error code in ``err``, as ``"E1000 CompileTimeHbmOom"``; None without one."""
    m = _CODE.search(str(err))
    return f"{m.group(1)} {m.group(2)}" if m else None


def from_xla(err: BaseException) -> bool:
    """Whether ``err`` is XLA's own (``jax.errors.JaxRuntimeError``, formerly ``XlaRuntimeError``)."""
    return any(t.__name__ in ("JaxRuntimeError", "XlaRuntimeError") for t in type(err).__mro__)


def out_of_memory(err: BaseException) -> bool:
    """Whether XLA's ``err`` says the program does not fit the device (a TPU's compile says so)."""
    return "RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err).lower()


def host_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is this machine's memory running out (not a device's)."""
    return isinstance(err, MemoryError) or any(h in str(err).lower() for h in _HOST)


def kind(err: BaseException) -> type[ExecutionError]:
    """Which failure ``err`` is: host or device out of memory, XLA's error, or the lab's bug."""
    if host_out_of_memory(err):
        return HostOutOfMemory
    if from_xla(err):
        return DeviceOutOfMemory if out_of_memory(err) else CompilerError
    return LabBug


def xla_words(err: BaseException) -> str:
    """XLA's message as quoted: its first line, and libtpu's error code where it gives one
    (``RESOURCE_EXHAUSTED: Ran out of memory on HBM, ... (error E1000 CompileTimeHbmOom)``)."""
    code, line = error_code(err), first_line(err)
    if not code:
        return line
    m = _CODE.search(line)  # the code as libtpu puts it in the line, "E1000: CompileTimeHbmOom: "
    rest = line[:m.start()] + line[m.end():].lstrip(": ") if m else line
    return f"{rest} (error {code})"


def where_in_lab(err: BaseException) -> str:
    """The innermost frame of ``err``'s traceback in the lab's own code, as ``"studies/x.py:12 in f"``."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "remat_lab" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.rsplit('remat_lab/', 1)[-1]}:{f.lineno} in {f.name}"


def lab_bug(stage: str, err: BaseException) -> LabBug:
    """``err``, raised by the lab's own code while ``stage``, as the lab's bug."""
    where = where_in_lab(err)
    return LabBug(f"Remat Lab failed while {stage}, from a bug in the lab and not your "
                  f"configuration: {type(err).__name__}: {first_line(err)}"
                  f"{f' (at {where})' if where else ''}. Running it again may work; if not, please "
                  "report it with the command or link that raised it.")


def compiler_error(stage: str, err: BaseException) -> CompilerError:
    """XLA's error other than memory: quoted, and no smaller model offered as its cure."""
    return CompilerError(f"XLA failed while {stage} with its own error, not a lack of memory: "
                         f"{xla_words(err)}. A smaller configuration will not cure this; a different "
                         "policy, attention kernel or mesh may avoid it.")


def host_oom(stage: str, err: BaseException, device_is_host: bool = False) -> HostOutOfMemory:
    """This machine's memory ran out; ``device_is_host``: the program runs on this machine's CPU,
    whose buffers share that memory (a smaller configuration is a cure), else the device may well
    hold the program."""
    said = "" if isinstance(err, MemoryError) and not str(err) else f" ({xla_words(err)})"
    cure = ("the CPU device's buffers live there too: lower width, batch, seq or depth, or close "
            "other jobs on this machine" if device_is_host else
            "not the device's, so the configuration may still fit its device: close other jobs on "
            "this machine, or compile it on one with more memory")
    return HostOutOfMemory(f"This machine's memory ran out while {stage}{said}; {cure}.")
