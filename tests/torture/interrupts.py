"""Interrupts at every step: a deterministic harness that raises KeyboardInterrupt or SystemExit
(or cancels the asyncio task) at every line of walj's own code on the path of an operation, one
trial per line event, and checks the handle, the files and the journal after each trial.

How it works:

- `Tracer` is a `sys.settrace` hook on the thread that runs the operation (only that thread). A
  'call' event in a frame whose module is in the `walj` package turns on line events for that
  frame; every 'line' event there is counted, and at the chosen one the tracer fires just before
  that line runs: it raises the exception (CPython propagates it into the traced frame, and
  unsets the tracer), or it calls `task.cancel()` (the CancelledError then lands at the task's
  next await).
- Where a real interrupt cannot land, the tracer does not land either. CPython raises a pending
  KeyboardInterrupt only at an "eval breaker" (after a call returns, at a backward jump, at a
  function's start), but it reports a line event at two places with none before them: the
  normal exit of a `with` block (before `__exit__` is called, outside the block's handler) and
  the normal-path copy of a `finally`. An interrupt aimed there is delivered at the next eval
  breaker instead, found with opcode events (so after `__exit__` returned). A `try:` line's NOP,
  which CPython leaves out of the exception table even inside a `with`, hands its interrupt on
  to the next instruction. Without this, every `with lock:` would look like a lock leak.
- `Injection` says what one trial does: only count ("count"), raise at the N-th walj line event
  or at the first event of one (file, line) ("raise"), cancel there ("cancel"), or cancel the
  task before the k-th event-loop iteration after the operation began ("step", through
  `StepLoop._run_once`; the landing point is then the await the task is suspended on).
- `drive` runs a `Scenario`: one counting run (K line events, their distinct (file, line)
  points, and the loop steps of an async operation), then a trial for every N in 1..K (for a
  long operation a sample that holds every distinct point at least once), then trials aimed at
  each distinct point no trial landed on. Each trial runs on a fresh copy of the same prepared
  directory, in a worker thread that must finish within a timeout (invariant 1); the tracer is
  removed in a `finally` whatever happens. Scenarios that start from the same state and reach
  the same walj lines in the same order up to an event (the three dispatch outcomes up to the
  handler, the recovery scan of an open in every sync mode) share one trial for that event.
  `Helpers` run the trials in other processes, one per core.

The invariants are numbered as in `INVARIANTS`; a broken one is a `Violation` naming the
operation, the sync mode, the injected interrupt and the walj file:line where it landed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import dis
import functools
import hashlib
import multiprocessing
import os
import shutil
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from approval_rules import approval_problems

import walj
from walj.journal.state import JournalState, rebuild
from walj.log import pending_requests

WALJ_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(walj.__file__)))

# How long a trial (the operation, its follow-ups, the checks of its files) may take before it
# counts as a deadlock. After a first deadlock in a scenario the rest of its trials get the
# short timeout, so a deadlock on every line costs seconds, not minutes.
TRIAL_TIMEOUT = 10.0
SHORT_TIMEOUT = 0.5

Point = tuple[str, int]  # (code file name, line number) of a walj line
INVARIANTS = {
    "0": "the interrupt propagates out of the operation, unchanged",
    "1": "nothing deadlocks",
    "2": "the handle is usable (next seq) or poisoned, never inconsistent",
    "3": "every acknowledged record reads back, seqs contiguous, verify clean",
    "4": "the log reopens in the default recovery mode",
    "5": "the journal's live view equals a replay of its log",
    "6": "fail closed: no handler runs while a replay blocks; blockers resolve; no bad intent",
    "7": "a later turn works; turn numbers never repeat",
}


# walj's finalizers: a log's (walj/log/_log.py) and any __del__.
FINALIZERS = frozenset({"__del__", "_close_abandoned"})


def _is_walj(frame: Any) -> bool:
    # A finalizer runs when the collector chooses, not on the operation's path, and CPython
    # swallows (prints) whatever is raised in it: it is no interrupt point of the operation.
    return (bool(frame.f_globals.get("__name__", "").startswith("walj"))
            and frame.f_code.co_name not in FINALIZERS)


_names: dict[Point, tuple[str, str]] = {}  # point -> (function, module)


def where(point: Point | None) -> str:
    """`walj/log/_log.py:203 (_write)` for a point; the file relative to walj's parent folder
    (code generated at import, such as a dataclass's __init__, is named by its module)."""
    if point is None:
        return "outside walj code"
    filename, line = point
    name, module = _names.get(point, ("", ""))
    if filename.endswith(".py"):
        rel = os.path.relpath(filename, WALJ_ROOT).replace(os.sep, "/")
    else:
        rel = f"{module or '?'}:{filename}"
    return f"{rel}:{line}" + (f" ({name})" if name else "")


# Instructions after which CPython checks for pending signals and asynchronous exceptions (its
# "eval breaker"): a real KeyboardInterrupt is raised only at one of these.
_EVAL_BREAKERS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW",
                            "CALL_FUNCTION_EX", "JUMP_BACKWARD", "JUMP_ABSOLUTE"})
_NO_FALLTHROUGH = frozenset({"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_ABSOLUTE", "JUMP",
                             "JUMP_BACKWARD_NO_INTERRUPT", "RETURN_VALUE", "RETURN_CONST",
                             "RERAISE", "RAISE_VARARGS"})


class _Code:
    """What the tracer needs to know about one code object's bytecode."""

    _cache: dict[Any, _Code] = {}

    def __init__(self, code: Any) -> None:
        self.instructions = list(dis.get_instructions(code))
        self.index = {i.offset: n for n, i in enumerate(self.instructions)}
        self.entries = list(getattr(dis.Bytecode(code), "exception_entries", None) or ())
        self.sources: dict[int, list[int]] = {}  # offset -> offsets of the jumps to it
        for i in self.instructions:
            if i.opname.startswith(("JUMP", "POP_JUMP")) and isinstance(i.argval, int):
                self.sources.setdefault(i.argval, []).append(i.offset)

    @classmethod
    def of(cls, code: Any) -> _Code:
        info = cls._cache.get(code)
        if info is None:
            info = cls._cache[code] = cls(code)
        return info

    def opname(self, offset: int) -> str | None:
        n = self.index.get(offset)
        return None if n is None else self.instructions[n].opname

    def handler(self, offset: int) -> int | None:
        for entry in self.entries:
            if entry.start <= offset < entry.end:
                return int(entry.target)
        return None

    def _shape(self, n: int, length: int) -> list[tuple[str, Any]]:
        return [(i.opname, i.argrepr) for i in self.instructions[n:n + length]]

    def leaves_region(self, offset: int) -> bool:
        """Is the instruction at `offset` the start of cleanup code that a region's exception
        handler would also run: a `with` block's normal `__exit__` call, or the normal-path
        copy of a `finally`? CPython reports a line event there before the cleanup runs, but
        no real interrupt can land there (the last eval-breaker check before it lies inside
        the region, the next one after it), so an interrupt is never made to skip cleanup."""
        n = self.index.get(offset)
        if n is None:
            return False
        first = n
        while first < len(self.instructions) and self.instructions[first].opname in (
                "SWAP", "COPY", "NOP"):
            first += 1  # a return inside the block keeps its value under the exit call
        ops = [i.opname for i in self.instructions[first:first + 5]]
        nones = [i.argrepr for i in self.instructions[first:first + 3]] == ["None"] * 3
        if (ops[:3] == ["LOAD_CONST"] * 3 and nones and "CALL" in ops[3:5]) or (
                ops[:4] == ["LOAD_CONST", "DUP_TOP", "DUP_TOP", "CALL_FUNCTION"]):
            return True  # a with statement's exit: __exit__(None, None, None)
        here = self.handler(offset)
        predecessors = list(self.sources.get(offset, ()))
        if n > 0 and self.instructions[n - 1].opname not in _NO_FALLTHROUGH:
            predecessors.append(self.instructions[n - 1].offset)
        for source in predecessors:
            target = self.handler(source)
            if target is None or target == here or target not in self.index:
                continue
            t = self.index[target]
            if self.instructions[t].opname == "PUSH_EXC_INFO":
                t += 1
            if self.instructions[t].opname == "WITH_EXCEPT_START":
                return True  # code reached from inside a with block, outside it: its exit
            if self._shape(t, 3) == self._shape(n, 3):
                return True  # the normal-path copy of the finally this region protects
        return False


class Tracer:
    """The trace hook of one trial. `armed` gates counting (async operations turn it on only
    around the operation itself).

    An interrupt aimed at a line event where code leaves a region with a handler (see
    `_Code.leaves_region`) is delivered where a real one would be: at the next eval-breaker
    point of that frame (so after a `with` statement's `__exit__` call), found with opcode
    events, or at the next walj line event of another frame, whichever comes first."""

    def __init__(self, injection: Injection, on_fire: Callable[[], None] | None = None) -> None:
        self.injection = injection
        self.on_fire = on_fire
        self.armed = True
        self.done = False
        self.pending: Any = None  # the frame where an aimed interrupt waits for its moment
        self._wait = "breaker"  # ... for an eval-breaker point, or for the "next" instruction
        self._at = -1  # the instruction it was aimed at
        self._previous_op: str | None = None
        self._finalizing = 0  # finalizer frames running now

    def global_trace(self, frame: Any, event: str, arg: Any) -> Any:
        if self.done or self._finalizing or not _is_walj(frame):
            return None
        if frame.f_code.co_name in FINALIZERS:
            # A finalizer runs wherever the garbage collector happens to start, not on the
            # operation's path: neither it nor what it calls is counted or interrupted.
            self._finalizing += 1
            return self._finalizer_trace
        return self.local_trace

    def _finalizer_trace(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "return":
            self._finalizing -= 1
        return self._finalizer_trace

    def local_trace(self, frame: Any, event: str, arg: Any) -> Any:
        if self.done:
            return None
        if self.pending is not None:
            self._wait_for_breaker(frame, event)
            return self.local_trace
        if event != "line" or not self.armed:
            return self.local_trace
        inj = self.injection
        inj.count += 1
        point = (frame.f_code.co_filename, frame.f_lineno)
        if point not in _names:
            _names[point] = (frame.f_code.co_name, frame.f_globals.get("__name__", ""))
        if inj.kind == "count":
            inj.events.append(point)
            return self.local_trace
        if inj.index is not None and inj.count != inj.index:
            return self.local_trace
        if inj.point is not None and point != inj.point:
            return self.local_trace
        inj.landed = point
        if self.on_fire is not None:  # a cancel: it lands at the task's next await anyway
            self.done = True
            inj.fired = True
            self.on_fire()
            return None
        code = _Code.of(frame.f_code)
        if code.leaves_region(frame.f_lasti):  # a `return` line's NOP before a with's exit too
            self.pending, self._wait = frame, "breaker"
        elif code.opname(frame.f_lasti) == "NOP":
            # A `try:` line: CPython leaves such NOPs out of the exception table (they cannot
            # raise), even inside a `with` block; the interrupt lands at the next instruction.
            self.pending, self._wait = frame, "next"
        else:
            self.deliver(frame)
        self._at = frame.f_lasti
        frame.f_trace_opcodes = True
        return self.local_trace

    def _wait_for_breaker(self, frame: Any, event: str) -> None:
        if frame is not self.pending:
            if event == "line":  # a walj callee (entered at an eval breaker) or the caller
                self.deliver(frame)
            return
        if event != "opcode" or frame.f_lasti == self._at:
            return
        if self._wait == "next" or self._previous_op in _EVAL_BREAKERS:
            self.deliver(frame)
        self._previous_op = _Code.of(frame.f_code).opname(frame.f_lasti)

    def deliver(self, frame: Any | None) -> None:
        """Raise the injected exception here (None: the operation returned first)."""
        inj = self.injection
        self.done = True
        inj.fired = True
        if self.pending is not None:
            self.pending.f_trace_opcodes = False
            inj.deferred_to = (f"{where((frame.f_code.co_filename, frame.f_lineno))} "
                               f"@{frame.f_lasti}" if frame is not None
                               else "the operation's return")
        assert inj.exception is not None
        raise inj.exception

    def finish(self) -> None:
        """After the operation: an interrupt still waiting for an eval breaker lands now, in
        the caller, as it would right after the call returned."""
        if not self.done and self.pending is not None:
            self.deliver(None)
        self.done = True


@dataclass
class Injection:
    """What one trial injects, and (after it) what happened."""

    kind: str  # "count", "raise", "cancel" or "step"
    index: int | None = None  # the N-th walj line event ...
    point: Point | None = None  # ... or the first event of this point
    exc_type: type[BaseException] | None = None
    step: int | None = None  # "step": cancel before this loop iteration (1 = the first)
    # filled in by the trial
    count: int = 0
    events: list[Point] = field(default_factory=list)
    steps: int = 0
    fired: bool = False
    landed: Point | None = None
    deferred_to: str | None = None  # where an interrupt aimed at a region exit was delivered
    exception: BaseException | None = None

    def __post_init__(self) -> None:
        if self.exc_type is not None:
            self.exception = self.exc_type("injected by the interrupt torture")

    @property
    def name(self) -> str:
        if self.kind in ("raise", "count"):
            return self.exc_type.__name__ if self.exc_type else "count"
        return "cancel" if self.kind == "cancel" else f"cancel@step{self.step}"

    def describe(self) -> str:
        target = (f"line event {self.index}" if self.index is not None
                  else f"step {self.step}" if self.step is not None
                  else f"first event of {where(self.point)}" if self.point is not None
                  else "")
        deferred = f", delivered at {self.deferred_to}" if self.deferred_to else ""
        return f"{self.name} at {where(self.landed)} ({target}{deferred})"

    def matches(self, exc: BaseException) -> bool:
        """Is `exc` the injected interrupt (the same object, or a CancelledError for a cancel)?"""
        if self.kind in ("cancel", "step"):
            return isinstance(exc, asyncio.CancelledError)
        return exc is self.exception

    # --- running an operation under the injection ------------------------------------------------

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run a sync operation with the tracer on this thread; the tracer is always removed."""
        if self.kind not in ("count", "raise"):
            return fn()
        tracer = Tracer(self)
        previous = sys.gettrace()
        sys.settrace(tracer.global_trace)
        try:
            value = fn()
            tracer.finish()
            return value
        finally:
            tracer.done = True
            sys.settrace(previous)

    async def acall(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Await an async operation with the tracer on the loop's thread (and, for "step", the
        loop counting its iterations); both are always removed."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        tracer = Tracer(self, on_fire=task.cancel if self.kind == "cancel" else None)
        traced = self.kind in ("count", "raise", "cancel")
        if isinstance(loop, StepLoop) and self.kind in ("count", "step"):
            loop.arm(self, task)
        previous = sys.gettrace()
        if traced:
            sys.settrace(tracer.global_trace)
        try:
            value = await make()
            if traced:
                tracer.finish()
            return value
        finally:
            tracer.done = True
            if traced:
                sys.settrace(previous)
            if isinstance(loop, StepLoop):
                loop.disarm()


def suspended_at(task: asyncio.Task[Any]) -> Point | None:
    """The innermost walj line a suspended task is waiting at (following cr_await)."""
    found: Point | None = None
    awaitable: Any = task.get_coro()
    for _ in range(64):
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            break
        if _is_walj(frame):
            found = (frame.f_code.co_filename, frame.f_lineno)
            _names.setdefault(found, (frame.f_code.co_name, frame.f_globals.get("__name__", "")))
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    return found


class StepLoop(asyncio.SelectorEventLoop):
    """An event loop that counts its iterations while armed and can cancel a task before one."""

    _injection: Injection | None = None
    _task: asyncio.Task[Any] | None = None

    def arm(self, injection: Injection, task: asyncio.Task[Any]) -> None:
        self._injection, self._task = injection, task

    def disarm(self) -> None:
        self._injection = self._task = None

    def _run_once(self) -> None:
        inj, task = self._injection, self._task
        if inj is not None and task is not None:
            inj.steps += 1
            if inj.kind == "step" and inj.steps == inj.step and not task.done():
                inj.fired = True
                inj.landed = suspended_at(task)
                task.cancel()
                self.disarm()
        super()._run_once()  # type: ignore[misc]


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, with daemon threads, and a shutdown that waits at most a
    timeout: a write stuck in a deadlocked log must not hang the test run at exit."""

    def __init__(self, timeout: float) -> None:
        super().__init__(max_workers=1)
        self._timeout = timeout
        self._daemons: list[threading.Thread] = []
        self.stuck = False

    def submit(self, fn: Callable[..., Any], /, *args: Any,  # type: ignore[override]
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: B036 - handed to the awaiter, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)

        thread = threading.Thread(target=run, name="walj-interrupts-executor", daemon=True)
        self._daemons.append(thread)
        thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if wait:
            for thread in self._daemons:
                thread.join(self._timeout)
                self.stuck = self.stuck or thread.is_alive()


def run_loop(main: Callable[[], Coroutine[Any, Any, Any]], timeout: float) -> Any:
    """asyncio.run on a StepLoop with a DaemonExecutor: the same clean-up (cancel what is left,
    run it out, shut the executor down, close), available on Python 3.10 too."""
    loop = StepLoop()
    executor = DaemonExecutor(timeout)
    loop.set_default_executor(executor)
    try:
        return loop.run_until_complete(main())
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
        if executor.stuck:
            raise Stuck("a write handed to the event loop's executor never finished")


class Stuck(Exception):
    """An executor thread of the operation never finished (reported as a deadlock)."""


# --- violations --------------------------------------------------------------------------------


class Violation(NamedTuple):
    invariant: str
    scenario: str
    mode: str
    injected: str
    point: str
    message: str

    def line(self) -> str:
        return (f"[{self.invariant}] {self.scenario} sync={self.mode}: {self.injected} at "
                f"{self.point}: {self.message}")


class Report:
    """The violations of one trial, and what it checked."""

    def __init__(self, scenario: str, mode: str, injection: Injection) -> None:
        self.scenario = scenario
        self.mode = mode
        self.injection = injection
        self.violations: list[Violation] = []
        self.checked = 0
        self.lost = 0
        self.stage = "setup"

    def fail(self, invariant: str, message: str) -> None:
        if not any(v.invariant == invariant and v.message == message for v in self.violations):
            inj = self.injection
            point = where(inj.landed) if inj.fired else "no interrupt"
            if inj.deferred_to:
                point += f", delivered at {inj.deferred_to}"
            self.violations.append(Violation(invariant, self.scenario, self.mode, inj.name,
                                             point, message))


def _stop_spinning(threads: list[threading.Thread]) -> None:
    """Ask stuck threads that still burn CPU (a thread spinning in a loop competes for the GIL
    and would slow every later trial) to stop at their next bytecode. A thread blocked on a
    lock is left alone: an asynchronous exception it never handles would keep every other
    thread's eval-breaker check busy."""
    def cpu() -> dict[int, float]:
        out = {}
        for t in threads:
            try:
                out[t.ident or 0] = time.clock_gettime(time.pthread_getcpuclockid(t.ident or 0))
            except (OSError, AttributeError, OverflowError):
                pass  # gone, or a platform without per-thread clocks
        return out

    first = cpu()
    time.sleep(0.1)
    second = cpu()
    for thread in threads:
        ident = thread.ident or 0
        if ident in first and ident in second and second[ident] - first[ident] > 0.01:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                       ctypes.py_object(SystemExit))


def run_bounded(body: Callable[[], None], report: Report, timeout: float) -> bool:
    """Run `body` in a worker thread; False (and a violation naming the stage and where the
    thread is stuck) if it does not finish within `timeout`."""
    before = set(threading.enumerate())
    failure: list[BaseException] = []

    def target() -> None:
        try:
            body()
        except BaseException as exc:  # noqa: B036 - a harness error, reported by the caller
            failure.append(exc)

    worker = threading.Thread(target=target, name="walj-interrupts-trial", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        frames = sys._current_frames()
        stack = "".join(traceback.format_stack(frames[worker.ident])[-4:]) if (
            worker.ident in frames) else "?"
        report.fail("1", f"{report.stage} did not finish within {timeout:.0f} s; stuck at\n"
                         f"{stack.rstrip()}")
        _stop_spinning([worker, *(t for t in threading.enumerate() if t not in before)])
        return False
    if failure:
        raise failure[0]
    return True


# --- scenarios and the driver ------------------------------------------------------------------


class Scenario:
    """One operation in one sync mode. Subclasses build the prepared directory once (`build`)
    and run one trial on a fresh copy of it (`trial`), under an injection."""

    name = "?"
    family = "?"
    is_async = False

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def build(self, base: Path) -> None:
        raise NotImplementedError

    def trial(self, path: Path, inj: Injection, report: Report) -> None:
        raise NotImplementedError


@dataclass
class Result:
    """What `drive` did for one scenario."""

    scenario: str
    family: str
    mode: str
    events: int = 0  # K, line events of the uninterrupted operation
    steps: int = 0  # loop iterations of the uninterrupted async operation
    reached: set[Point] = field(default_factory=set)  # distinct points of the counting run
    interrupted: set[Point] = field(default_factory=set)  # distinct points a trial landed on
    shared: set[Point] = field(default_factory=set)  # covered by an identical earlier trial
    trials: int = 0
    fired: int = 0
    checked: int = 0
    lost: int = 0
    violations: list[Violation] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # trial directories with a violation

    @property
    def covered(self) -> set[Point]:
        return self.interrupted | self.shared

    def summary(self) -> str:
        return (f"{self.scenario} sync={self.mode}: K={self.events} line events, "
                f"{len(self.reached)} distinct walj lines, {len(self.interrupted)} interrupted "
                f"here and {len(self.shared - self.interrupted)} by an identical trial of "
                f"another scenario, {self.trials} trials")


def prefix_signatures(events: list[Point]) -> list[bytes]:
    """A digest of events[:i] for each i: two trials whose operation reached the same walj
    lines in the same order, from the same prepared state, are the same trial."""
    digest = hashlib.blake2b(digest_size=16)
    out = []
    for filename, line in events:
        digest.update(f"{filename}:{line};".encode())
        out.append(digest.copy().digest())
    return out


def plan(events: list[Point], rng: Any, full_limit: int, done: Callable[[int], bool]) -> list[int]:
    """Indices (1-based) of the line events to interrupt: every one for a short operation; for
    a long one, one random occurrence of each distinct point, topped up at random. Indices
    `done` says an identical trial already covered are left out (and a point with such an
    occurrence needs no other)."""
    k = len(events)
    if k <= full_limit:
        return [i for i in range(1, k + 1) if not done(i)]
    occurrences: dict[Point, list[int]] = defaultdict(list)
    for i, point in enumerate(events, start=1):
        occurrences[point].append(i)
    chosen = {rng.choice(indices) for indices in occurrences.values()
              if not any(done(i) for i in indices)}
    rest = [i for i in range(1, k + 1) if i not in chosen and not done(i)]
    rng.shuffle(rest)
    chosen.update(rest[:max(0, full_limit - len(chosen))])
    return sorted(chosen)


@dataclass
class Batch:
    """What a batch of trials did; a helper process sends it back."""

    outcomes: list[tuple[bool, Point | None, str | None]] = field(default_factory=list)
    counts: list[tuple[list[Point], int]] = field(default_factory=list)  # events, loop steps
    violations: list[Violation] = field(default_factory=list)
    checked: int = 0
    lost: int = 0
    kept: list[Path] = field(default_factory=list)
    names: dict[Point, tuple[str, str]] = field(default_factory=dict)


def run_batch(scenario: Scenario, base: Path, workdir: Path, injections: list[Injection],
              prefix: str) -> Batch:
    """One trial per injection, each on a fresh copy of `base`, each in a bounded thread."""
    batch = Batch()
    timeout = TRIAL_TIMEOUT
    for n, inj in enumerate(injections, start=1):
        path = workdir / f"{prefix}{n}"
        shutil.copytree(base, path, symlinks=True)
        report = Report(scenario.name, scenario.mode, inj)
        finished = run_bounded(functools.partial(scenario.trial, path, inj, report), report,
                               timeout)
        if not finished:
            timeout = SHORT_TIMEOUT
        batch.outcomes.append((inj.fired, inj.landed, inj.deferred_to))
        batch.counts.append((inj.events, inj.steps))
        batch.checked += report.checked
        batch.lost += report.lost
        batch.violations.extend(report.violations)
        # A trial with a violation keeps its directory: for a look, and because a lock it leaked
        # stays keyed by the directory's inode, which a new directory must not reuse.
        if report.violations:
            batch.kept.append(path)
        elif finished:
            shutil.rmtree(path, ignore_errors=True)
        for point in {inj.landed, *inj.events}:
            if point in _names:
                batch.names[point] = _names[point]
    return batch


class Helpers:
    """Processes that run the trials: every core the suite's budget counts on works, and the
    test process itself never runs traced code (a crash in a trial costs a helper, which is
    replaced, not the test run). Started on first use, with "spawn" (this process has threads).
    With no processes, trials run in this process."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def run(self, scenario: Scenario, base: Path, workdir: Path,
            parts: list[tuple[list[Injection], str]]) -> list[Batch]:
        if self.processes < 1:
            return [run_batch(scenario, base, workdir, part, prefix) for part, prefix in parts]
        for attempt in range(2):
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.processes, mp_context=multiprocessing.get_context("spawn"))
            futures = [self._pool.submit(run_batch, scenario, base, workdir, part,
                                         f"{prefix}a{attempt}-") for part, prefix in parts]
            try:
                return [f.result() for f in futures]
            except concurrent.futures.process.BrokenProcessPool:
                self.close()  # a trial process died (a crash of the interpreter): once more
        raise AssertionError(f"{scenario.name} sync={scenario.mode}: a trial process died twice "
                             "on the same trials")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def drive(scenario: Scenario, workdir: Path, rng: Any, *, full_limit: int,
          exceptions: tuple[type[BaseException], ...], both: bool,
          shared: dict[tuple[str, bytes], str] | None = None,
          helpers: Helpers | None = None) -> Result:
    """Count, then interrupt at every (sampled) line event, then at every point still missed.

    `shared` maps (injection kind, prefix signature) to the scenario that ran that trial;
    scenarios that start from the same prepared state and run the same walj lines up to an
    event pass one mapping, and an event already interrupted there is not interrupted again.
    `helpers` run the trials in other processes.
    """
    result = Result(scenario.name, scenario.family, scenario.mode)
    base = workdir / "base"
    base.mkdir(parents=True)
    scenario.build(base)
    label = f"{scenario.name} sync={scenario.mode}"
    seen: dict[tuple[str, bytes], str] = {} if shared is None else shared
    rounds = iter(range(1, 10**9))
    runner = helpers if helpers is not None else Helpers(0)

    def run(injections: list[Injection], *, spread: bool) -> None:
        shares = max(1, runner.processes) if spread else 1
        tag = next(rounds)
        parts = [(injections[i::shares], f"r{tag}p{i}") for i in range(shares)]
        parts = [(part, prefix) for part, prefix in parts if part]
        for (part, _), batch in zip(parts, runner.run(scenario, base, workdir, parts),
                                    strict=True):
            _names.update(batch.names)
            for inj, (fired, landed, deferred_to), (events, steps) in zip(
                    part, batch.outcomes, batch.counts, strict=True):
                inj.fired, inj.landed, inj.deferred_to = fired, landed, deferred_to
                inj.events, inj.steps = events, steps
                if inj.kind != "count":
                    result.trials += 1
                    result.fired += fired
                    if fired and landed is not None:
                        result.interrupted.add(landed)
            result.checked += batch.checked
            result.lost += batch.lost
            result.violations.extend(batch.violations)
            result.kept.extend(batch.kept)

    counting = Injection("count")
    run([counting], spread=False)
    if counting.fired or not counting.events:
        raise AssertionError(f"{scenario.name}: the counting run reached no walj line")
    events = counting.events
    result.events = len(events)
    result.steps = counting.steps
    result.reached = set(events)
    signatures = prefix_signatures(events)
    planned: list[tuple[str, int, Injection]] = []
    for kind in ["raise", "cancel"] if scenario.is_async else ["raise"]:
        def done(i: int, kind: str = kind) -> bool:
            return (kind, signatures[i - 1]) in seen

        if kind == "raise":
            result.shared.update(events[i - 1] for i in range(1, len(events) + 1) if done(i))
        for i in plan(events, rng, full_limit, done):
            if kind == "cancel":
                planned.append((kind, i, Injection("cancel", index=i)))
            else:
                pick = list(exceptions) if both else [exceptions[i % len(exceptions)]]
                planned += [(kind, i, Injection("raise", index=i, exc_type=e)) for e in pick]
    if scenario.is_async:
        planned += [("step", 0, Injection("step", step=k)) for k in range(1, result.steps + 2)]
    run([inj for _, _, inj in planned], spread=True)
    for kind, i, inj in planned:
        if kind != "step" and inj.fired and inj.landed == events[i - 1]:
            seen.setdefault((kind, signatures[i - 1]), label)
    for attempt in range(3):  # timestamps change record sizes, so rotations move a little
        missing = sorted(result.reached - result.covered)
        if not missing:
            break
        run([Injection("raise", point=p, exc_type=exceptions[attempt % len(exceptions)])
             for p in missing], spread=True)
    return result


# --- checks: the log ---------------------------------------------------------------------------

Ack = tuple[int, dict[str, Any]]


def last_seq_on_disk(path: Path) -> int:
    last = 0
    for record in walj.read(path):
        last = record.seq
    return last


class LogFollowUps:
    """Invariant 2 on an open handle after the interrupt, then close it."""

    def __init__(self, report: Report, acked: list[Ack], attempted: list[dict[str, Any]], *,
                 closing: bool) -> None:
        self.report = report
        self.acked = acked
        self.attempted = attempted  # written by calls that did not return: may be on disk
        self.closing = closing  # the interrupted operation was close(): ClosedError is allowed
        self.refused: str | None = None  # the first PoisonedError / ClosedError seen

    def _refusal(self, what: str, exc: BaseException) -> None:
        rep = self.report
        if isinstance(exc, walj.PoisonedError):
            if self.refused == "ClosedError":
                rep.fail("2", f"{what} raised PoisonedError after an earlier ClosedError")
            self.refused = self.refused or "PoisonedError"
        elif isinstance(exc, walj.ClosedError):
            if not self.closing:
                rep.fail("2", f"{what} raised ClosedError, yet the log was never closed")
            self.refused = self.refused or "ClosedError"
        else:
            rep.fail("2", f"{what} raised {type(exc).__name__}: {exc}")
            self.refused = self.refused or type(exc).__name__

    def _succeeded(self, what: str) -> None:
        if self.refused is not None:
            self.report.fail("2", f"{what} succeeded after an earlier {self.refused}: a "
                                  "refusing handle must refuse every later write")

    def run(self, log: walj.Log, path: Path) -> None:
        rep = self.report
        rep.stage = "the follow-up writes"
        try:
            expected = last_seq_on_disk(path) + 1
        except walj.CorruptionError as exc:
            rep.fail("3", f"walj.read of the live log refuses after the interrupt: {exc}")
            expected = None
        acked_last = self.acked[-1][0] if self.acked else 0
        if expected is not None and expected <= acked_last:
            rep.fail("3", f"the log on disk ends at {expected - 1}, before acknowledged seq "
                          f"{acked_last}")
        n = 0
        for step in ("append", "append", "append_many", "sync", "append"):
            n += 1
            data = {"after": n, "step": step}
            datas = ([data] if step == "append" else
                     [{"after": n, "i": i} for i in range(2)] if step == "append_many" else [])
            try:
                if step == "append":
                    seqs = [log.append(data)]
                elif step == "append_many":
                    seqs = log.append_many(datas)
                else:
                    log.sync()
                    seqs = []
            except Exception as exc:
                self.attempted.extend(datas)
                self._refusal(step, exc)
                continue
            self._succeeded(step)
            for seq, d in zip(seqs, datas, strict=True):
                if expected is not None and seq != expected:
                    rep.fail("2", f"{step} returned seq {seq}; the next seq is {expected} "
                                  f"(the log on disk ends at {expected - 1})")
                expected = seq + 1
                self.acked.append((seq, d))
        rep.stage = "close"
        for attempt in ("close", "a second close"):
            try:
                log.close()
            except walj.PoisonedError:
                if self.refused != "PoisonedError" and attempt == "close":
                    rep.fail("2", "close raised PoisonedError, yet every follow-up write "
                                  "succeeded")
            except Exception as exc:
                rep.fail("2", f"{attempt} raised {type(exc).__name__}: {exc}")


def check_log_files(path: Path, report: Report, acked: list[Ack], attempted: Container[Any],
                    reopen: Callable[[], walj.Log]) -> None:
    """Invariants 3 and 4 on a closed log: verify, reopen, read back every acknowledged record."""
    rep = report
    rep.stage = "verify"
    found = walj.verify(path)
    if not found.ok:
        rep.fail("3", "verify: " + "; ".join(p.describe() for p in found.problems)[:400])
    rep.stage = "reopen"
    try:
        log = reopen()
    except walj.CorruptionError as exc:
        rep.fail("4", f"reopen refused: CorruptionError {exc.kind}: {exc}"[:400])
        _count_acked(path, rep, acked, attempted, salvage=True)
        return
    except walj.LockedError as exc:
        rep.fail("4", f"reopen refused: the directory is still locked: {exc}")
        _count_acked(path, rep, acked, attempted, salvage=True)
        return
    try:
        _count_acked(path, rep, acked, attempted, salvage=False)
        rep.stage = "append after reopen"
        last = log.last_seq
        on_disk = last_seq_on_disk(path)
        if last != on_disk:
            rep.fail("4", f"the reopened log says last_seq {last}; the files end at {on_disk}")
        seq = log.append({"reopened": True})
        if seq != on_disk + 1:
            rep.fail("4", f"the first append after reopening got seq {seq}, not {on_disk + 1}")
    finally:
        log.close()
    rep.stage = "read after reopen"
    try:
        records = list(walj.read(path))
        if [r.seq for r in records] != list(range(1, len(records) + 1)):
            rep.fail("3", "seqs are not contiguous from 1 after reopening and appending")
    except walj.CorruptionError as exc:
        rep.fail("4", f"the log written after the reopen does not read back: {exc}")


def _count_acked(path: Path, rep: Report, acked: list[Ack], attempted: Container[Any],
                 *, salvage: bool) -> None:
    rep.stage = "read back"
    try:
        records = list(walj.read(path, recovery="salvage" if salvage else "tolerate_tail"))
    except walj.CorruptionError as exc:
        rep.fail("3", f"walj.read refuses: {exc}"[:300])
        records = list(walj.read(path, recovery="salvage"))
    seqs = [r.seq for r in records]
    repeats = [s for s, c in Counter(seqs).items() if c > 1]
    if repeats:
        rep.fail("3", f"seqs repeat: {sorted(repeats)[:5]}")
    elif not salvage and seqs != list(range(1, len(seqs) + 1)):
        rep.fail("3", f"seqs are not contiguous from 1: {seqs[:3]}...{seqs[-3:]}")
    by_seq: dict[int, dict[str, Any]] = {}
    for r in records:
        by_seq.setdefault(r.seq, r.data)
    missing = [seq for seq, data in acked if by_seq.get(seq) != data]
    rep.checked += len(acked) - len(missing)
    rep.lost += len(missing)
    if missing:
        rep.fail("3", f"{len(missing)} acknowledged record(s) do not read back with their data "
                      f"(seqs {missing[:5]})")
    known = {seq for seq, _ in acked}
    invented = [r.seq for r in records if r.seq not in known and r.data not in attempted]
    if invented:
        rep.fail("3", f"records no call wrote: seqs {invented[:5]}")


# --- checks: the journal -----------------------------------------------------------------------

STARTED = "tool_execution_started"
FINISHED = "tool_execution_finished"
AMBIGUOUS = "tool_execution_ambiguous"
BLOCKED = "tool_execution_blocked"
RESOLVED = "tool_execution_resolved"
REFUSED = "tool_execution_refused"
REPLAYED = "tool_execution_replayed"
TERMINAL = (FINISHED, BLOCKED, RESOLVED, REFUSED)


def blocker_keys(recovery: walj.Recovery, lenient: bool) -> set[tuple[str, str]]:
    """(execution id or turn, state) of each blocker; `lenient` folds started into ambiguous."""
    keys = set()
    for b in recovery.blockers:
        ident = b.execution_id if b.execution_id is not None else f"turn {b.turn_sequence}"
        state = "started|ambiguous" if lenient and b.state in ("started", "ambiguous") else b.state
        keys.add((ident, state))
    return keys


def approval_keys(recovery: walj.Recovery) -> set[tuple[str, str]]:
    """(approval id, status) of each pending request and each approval not used yet."""
    return {(a.approval_id, a.status) for a in (*recovery.approvals, *recovery.approved)}


def compare_views(live: walj.Recovery, replay: walj.Recovery, lenient: bool) -> str | None:
    a, b = blocker_keys(live, lenient), blocker_keys(replay, lenient)
    if a != b:
        return (f"live blockers {sorted(a - b)} are not in a replay; replay blockers "
                f"{sorted(b - a)} are not live")
    a, b = approval_keys(live), approval_keys(replay)
    if a != b:
        return (f"live approvals {sorted(a - b)} are not in a replay; replay approvals "
                f"{sorted(b - a)} are not live")
    return None


def replay_of(path: Path) -> walj.Recovery:
    return rebuild((r.seq, r.data) for r in walj.read(path)).snapshot()


def journal_log_problems(records: Iterable[walj.Record]) -> Iterator[tuple[str, str]]:
    """From the log alone: (invariant, problem) for a repeated turn number, a second terminal
    record, and an intent written while an earlier execution that cannot be in flight is open:
    one with an ambiguous record and no resolution, or one of an earlier turn (one turn is live
    at a time, and a dispatch returns before its turn ends), or while an earlier tool-bearing
    turn is interrupted. Executions of the intent's own turn may be in flight (concurrent
    adispatch calls), so they do not count."""
    state = JournalState()
    turns: dict[int, int] = {}
    terminal: dict[str, str] = {}
    for r in records:
        data = r.data
        kind = data.get("kind")
        if kind == "turn_started":
            turn = data.get("turn_sequence")
            if isinstance(turn, int) and turn in turns:
                yield "7", f"turn {turn} started twice (seqs {turns[turn]} and {r.seq})"
                continue  # a replay refuses it; go on with the rest
            if isinstance(turn, int):
                turns[turn] = r.seq
        elif kind == STARTED:
            turn = data.get("turn_sequence")
            maybe_in_flight = {b.execution_id for b in state.snapshot(live_turn=turn).blockers
                               if b.state == "started" and b.turn_sequence == turn}
            view = state.snapshot(live_turn=turn, live_executions=maybe_in_flight)
            if view.blocked:
                blockers = [f"{b.state} {(b.execution_id or '')[:8] or b.turn_sequence}"
                            for b in view.blockers]
                yield "6", (f"intent at seq {r.seq} was written while a replay of the log "
                            f"before it blocks on {blockers}")
        elif kind in TERMINAL:
            eid = data.get("execution_id")
            if isinstance(eid, str) and eid in terminal:
                yield "6", f"execution {eid[:8]} has two terminal records ({terminal[eid]}, {kind})"
            elif isinstance(eid, str):
                terminal[eid] = kind
        state.feed(r.seq, data)


@dataclass
class JournalAcks:
    """What the journal acknowledged to its caller in a trial."""

    results: dict[str, str] = field(default_factory=dict)  # execution id -> outcome
    resolved: set[str] = field(default_factory=set)
    resolved_turns: set[int] = field(default_factory=set)
    turns: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    replayed: set[str] = field(default_factory=set)  # settled executions a replay answered from
    requests: set[str] = field(default_factory=set)  # resolution requests posted (durable)
    # Approval id -> what was acknowledged of it: "pending" (a dispatch answered
    # awaiting_approval), "approved", "denied", or "consumed" (a run on it returned).
    approvals: dict[str, str] = field(default_factory=dict)

    def result(self, result: walj.ToolResult) -> None:
        if result.outcome in ("awaiting_approval", "denied", "approval_expired"):
            if result.outcome == "awaiting_approval" and result.approval_id:
                self.approvals.setdefault(result.approval_id, "pending")
            return  # nothing ran, and no execution was written
        if result.approval_id and not result.replayed:
            self.approvals[result.approval_id] = "consumed"
        if result.replayed:
            self.replayed.add(result.execution_id)
        else:
            self.results[result.execution_id] = result.outcome


class JournalFollowUps:
    """Invariants 5, 6 and 7 on an open journal after the interrupt, then close it."""

    def __init__(self, report: Report, acks: JournalAcks, *, lenient: bool,
                 closing: bool = False, gated: dict[str, Any] | None = None) -> None:
        self.report = report
        # The gated call of an approval scenario, {"call_id", "tool", "arguments"}: dispatched
        # again after the interrupt, it must run exactly when a replay holds its approval.
        self.gated = gated
        self.acks = acks
        self.lenient = lenient
        self.closing = closing  # the interrupted operation was close(): ClosedError is allowed
        self.poisoned = False
        self.closed = False

    def _spy_dispatch(self, journal: walj.ToolJournal, n: int) -> tuple[bool, str] | None:
        """A fresh call in a fresh turn; (handler ran, outcome), or None if refused/failed."""
        rep = self.report
        ran: list[int] = []

        def spy(n: int) -> int:
            ran.append(n)
            return n

        try:
            with journal.turn() as turn:
                self.acks.turns.add(turn.sequence)
                result = turn.dispatch("spy", {"n": n}, handler=spy)
                self.acks.result(result)
            self.acks.completed.add(turn.sequence)
        except walj.PoisonedError:
            self.poisoned = True
            return None
        except walj.ClosedError as exc:
            if not self.closing:
                rep.fail("2", f"a follow-up dispatch raised ClosedError, yet the journal was "
                              f"never closed: {exc}")
            self.closed = True
            return None
        except walj.TurnError as exc:
            rep.fail("7", f"a new turn is refused: {exc}")
            return None
        except Exception as exc:
            rep.fail("6", f"a follow-up dispatch raised {type(exc).__name__}: {exc}")
            return None
        if bool(ran) != (result.outcome != "blocked"):
            rep.fail("6", f"dispatch said {result.outcome!r}, yet its handler ran {len(ran)} "
                          "time(s)")
        return bool(ran), result.outcome

    def run(self, journal: walj.ToolJournal, path: Path) -> None:
        rep = self.report
        rep.stage = "the live view against a replay"
        mismatch: str | None = None
        replay: walj.Recovery | None = None
        try:
            live = journal.recovery
        except Exception as exc:
            rep.fail("5", f"journal.recovery raised {type(exc).__name__}: {exc}")
            live = None
        try:
            replay = replay_of(path)
        except walj.CorruptionError as exc:
            rep.fail("5", f"a replay of the files refuses: {exc}"[:300])
        if live is not None and replay is not None:
            mismatch = compare_views(live, replay, self.lenient)
        self._gated_dispatch(journal, replay, mismatch)
        rep.stage = "a dispatch after the interrupt"
        first = self._spy_dispatch(journal, 1)
        if mismatch is not None and not self.poisoned:
            rep.fail("5", mismatch)
        if self.closed:
            mismatch = None  # a closed journal's view is not used any more
        if self.poisoned:
            rep.stage = "a second dispatch on a poisoned journal"
            again = self._spy_dispatch(journal, 2)
            if again is not None and again[0]:
                rep.fail("6", "the journal refused a dispatch as poisoned, then ran the next one")
        elif first is not None and replay is not None:
            ran, outcome = first
            if replay.blocked and ran:
                rep.fail("6", f"a handler ran although a replay blocks on "
                              f"{sorted(blocker_keys(replay, False))}")
            if not replay.blocked and not ran:
                rep.fail("6", f"dispatch refused ({outcome}) although a replay has no blocker; "
                              f"live blockers {sorted(blocker_keys(journal.recovery, False))}")
        if not (self.poisoned or self.closed) and replay is not None and replay.blocked:
            rep.stage = "resolving what the replay lists"
            for b in replay.blockers:
                self._resolve(journal, b)
            if not self.poisoned:
                rep.stage = "a dispatch after resolving"
                after = self._spy_dispatch(journal, 3)
                if after is not None and not after[0]:
                    rep.fail("6", f"dispatch still refused after resolving every blocker a "
                                  f"replay lists; live blockers "
                                  f"{sorted(blocker_keys(journal.recovery, False))}")
        rep.stage = "close"
        for attempt in ("close", "a second close"):
            try:
                journal.close()
            except walj.PoisonedError:
                pass  # allowed on a poisoned log
            except Exception as exc:
                rep.fail("2", f"journal {attempt} raised {type(exc).__name__}: {exc}")

    def _gated_dispatch(self, journal: walj.ToolJournal, replay: walj.Recovery | None,
                        mismatch: str | None) -> None:
        """In an approval scenario, dispatch its call again: the handler runs once if a replay
        holds an approved, unexpired, unused approval for it and nothing blocks; else never.
        (Not when the live view differs from the replay: that is reported already.)"""
        call = self.gated
        if call is None or replay is None or mismatch is not None:
            return
        rep = self.report
        rep.stage = "the gated call again after the interrupt"
        ran: list[int] = []
        now = time.time()
        approved = [a for a in replay.approved if a.call_id == call["call_id"]
                    and not a.expired(now + 1.0)]
        expect_run = bool(approved) and not replay.blocked
        try:
            with journal.turn() as turn:
                self.acks.turns.add(turn.sequence)
                result = turn.dispatch(call["tool"], call["arguments"], call_id=call["call_id"],
                                       handler=lambda x: ran.append(x) or {"x": x},
                                       approval=True)
                self.acks.result(result)
            self.acks.completed.add(turn.sequence)
        except walj.PoisonedError:
            self.poisoned = True
            return
        except Exception as exc:
            rep.fail("6", f"the gated dispatch raised {type(exc).__name__}: {exc}")
            return
        if len(ran) > 1 or bool(ran) != expect_run:
            rep.fail("6", f"the gated call ran {len(ran)} time(s) ({result.outcome}); a replay "
                          f"holds approvals {[a.approval_id for a in approved]}, blocked "
                          f"{replay.blocked}")
        elif ran and result.approval_id != approved[0].approval_id:
            rep.fail("6", f"the gated call ran on {result.approval_id}, not on "
                          f"{approved[0].approval_id}")

    def _resolve(self, journal: walj.ToolJournal, b: walj.Blocker) -> None:
        rep = self.report
        try:
            if b.execution_id is not None:
                journal.resolve(b.execution_id, "not_performed", actor="torture",
                                note="settled by the interrupt torture")
                self.acks.resolved.add(b.execution_id)
            else:
                assert b.turn_sequence is not None
                journal.resolve_turn(b.turn_sequence, actor="torture", note="interrupt torture")
                self.acks.resolved_turns.add(b.turn_sequence)
        except walj.PoisonedError:
            self.poisoned = True
        except walj.ResolutionError as exc:
            what = b.execution_id[:8] if b.execution_id else f"turn {b.turn_sequence}"
            rep.fail("6", f"resolving {b.state} blocker {what} that a replay lists is refused "
                          f"[{exc.reason}]")
        except Exception as exc:
            rep.fail("6", f"resolve raised {type(exc).__name__}: {exc}")


def check_journal_files(path: Path, report: Report, acks: JournalAcks) -> None:
    """Invariants 3, 4, 6 and 7 on a closed journal: its log alone, the acknowledged facts,
    and a fresh open whose recovery must equal the replay of the files."""
    rep = report
    rep.stage = "verify the journal's log"
    found = walj.verify(path)
    if not found.ok:
        rep.fail("3", "verify: " + "; ".join(p.describe() for p in found.problems)[:400])
    try:
        records = list(walj.read(path))
    except walj.CorruptionError as exc:
        rep.fail("3", f"walj.read refuses the journal's log: {exc}")
        return
    # From 1, or, once compaction dropped segments, from the base it recorded.
    first = found.base.first_seq if found.base is not None else 1
    if [r.seq for r in records] != list(range(first, first + len(records))):
        rep.fail("3", f"the journal's seqs are not contiguous from {first}")
    rep.stage = "the journal's log alone"
    for invariant, problem in journal_log_problems(records):
        rep.fail(invariant, problem)
    terminal: dict[str, dict[str, Any]] = {}
    turns: set[int] = set()
    completed: Counter[int] = Counter()
    resolved_turns: set[int] = set()
    replayed: set[str] = set()
    for r in records:
        kind = r.data.get("kind")
        if kind == REPLAYED:
            replayed.add(r.data["execution_id"])
        elif kind in TERMINAL:
            terminal.setdefault(r.data["execution_id"], r.data)
        elif kind == "turn_started":
            turns.add(r.data["turn_sequence"])
        elif kind == "turn_completed":
            completed[r.data["turn_sequence"]] += 1
        elif kind == "turn_resolved":
            resolved_turns.add(r.data["turn_sequence"])
    facts = wrong = 0
    for eid, outcome in acks.results.items():
        facts += 1
        t = terminal.get(eid)
        ok = t is not None and (
            t["kind"] == BLOCKED if outcome == "blocked" else
            t["kind"] == REFUSED if outcome == "refused" else t.get("outcome") == outcome)
        if not ok:
            wrong += 1
            rep.fail("3", f"dispatch returned {outcome!r} for {eid[:8]}; its terminal record is "
                          f"{t and (t['kind'], t.get('outcome'))}")
    for eid in acks.replayed - replayed:
        facts += 1
        wrong += 1
        rep.fail("3", f"a replay of {eid[:8]} was acknowledged but is not on disk")
    for eid in acks.resolved:
        facts += 1
        if terminal.get(eid, {}).get("kind") != RESOLVED:
            wrong += 1
            rep.fail("3", f"resolution of {eid[:8]} was acknowledged but is not on disk")
    for turn in acks.turns:
        facts += 1
        if turn not in turns:
            wrong += 1
            rep.fail("3", f"turn {turn} was entered but its turn_started is not on disk")
    for turn in acks.completed:
        facts += 1
        if not completed[turn]:
            wrong += 1
            rep.fail("3", f"turn {turn} completed but its turn_completed is not on disk")
    for turn in acks.resolved_turns - resolved_turns:
        facts += 1
        wrong += 1
        rep.fail("3", f"resolution of turn {turn} was acknowledged but is not on disk")
    rep.checked += facts - wrong
    rep.lost += wrong
    check_approvals(records, acks, rep)
    rep.stage = "reopen the journal"
    left = pending_requests(path)
    try:
        journal = walj.ToolJournal.open(path)
    except (walj.CorruptionError, walj.LockedError) as exc:
        rep.fail("4", f"ToolJournal.open refused: {type(exc).__name__}: {exc}"[:400])
        return
    try:  # the open changed nothing (no tools: nothing to settle), so the records stand
        if left:  # but for the requests it answered
            records = list(walj.read(path))
        check_request_answers(path, records, acks, left, rep)
        replay = rebuild((r.seq, r.data) for r in records).snapshot()
        mismatch = compare_views(journal.recovery, replay, lenient=False)
        if mismatch:
            rep.fail("5", f"a fresh open: {mismatch}")
    finally:
        journal.close()


def check_approvals(records: list[walj.Record], acks: JournalAcks, rep: Report) -> None:
    """Invariants 3 and 6 for approvals: every acknowledged request, decision and use is on
    disk, and from the log alone no intent ran without a matching, unused approval, nor twice
    on one (approval_rules.py)."""
    rep.stage = "the journal's approvals"
    ledger, problems = approval_problems((r.seq, r.data) for r in records)
    for problem in problems:
        rep.fail("6", problem)
    for aid, status in acks.approvals.items():
        rep.checked += 1
        on_disk = ("consumed" if aid in ledger.used_by else ledger.decisions.get(aid)
                   or ("pending" if aid in ledger.requests else None))
        # What was acknowledged may have moved on since (a pending request decided after).
        later = {"pending": ("pending", "approved", "denied", "consumed"),
                 "approved": ("approved", "consumed"), "denied": ("denied",),
                 "consumed": ("consumed",)}[status]
        if on_disk not in later:
            rep.lost += 1
            rep.fail("3", f"approval {aid} was acknowledged {status}; on disk: {on_disk}")


def check_request_answers(path: Path, records: list[walj.Record], acks: JournalAcks,
                          left: list[str], rep: Report) -> None:
    """Invariants 3 and 6 for resolution requests, once a reopen answered what was left: every
    request answered at most once (never applied twice), every posted one answered (none
    lost), and no request file left behind."""
    answers = Counter(r.data["request"] for r in records
                      if isinstance(r.data.get("request"), str))
    for request_id, count in answers.items():
        if count > 1:
            rep.fail("6", f"request {request_id[:8]} was answered {count} times")
    for request_id in acks.requests | set(left):
        rep.checked += 1
        if not answers[request_id]:
            rep.lost += 1
            rep.fail("3", f"request {request_id[:8]} was posted but never answered")
    still = pending_requests(path)
    if still:
        rep.fail("6", f"request files left after a reopen answered them: {still}")
