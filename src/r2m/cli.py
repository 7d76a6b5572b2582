"""The ``r2m`` console script: one subcommand per DAG stage plus tools.

Stage subcommands come from the stage registry (:mod:`r2m.stage.registry`); their modules are
imported only when the subcommand runs, so ``r2m dag --check`` and ``r2m --help`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path

from r2m.stage import registry as S
from r2m.utils.cliargs import OneLineParser

# tools that are not DAG stages: name -> (module:function, help)
TOOLS: dict[str, tuple[str, str]] = {
    "dag": ("r2m.pipeline.dag:main", "write or check dvc.yaml against the stage registry"),
    "stamps": ("r2m.pipeline.stamps_cmd:main",
               "check every stage instance against its record and write its stamp .stamps/<stage>/<instance>.json "
               "(the params keys it read, current or stale; DVC's params files)"),
    "bench": ("r2m.bench.registry:main", "benchmarks (r2m bench --help lists each)"),
    "compare": ("r2m.evaluation.compare:main",
                "metrics of two or more captioners with 95% bootstrap intervals and paired randomization tests of B - A (Holm for more than two)"),
    "power": ("r2m.evaluation.power:main",
              "how many test images or seeds resolve a metric difference, from the spreads in a results folder"),
    "warm": ("r2m.cli:warm", "run a command (e.g. snakemake) whose r2m stage jobs start warm: forked from "
                              "a server that imported torch & co. once"),
    "why": ("r2m.pipeline.why_cmd:main", "is a stage instance current? what changed since its last run, one line each"),
    "datasets": ("r2m.pipeline.datasets_cmd:main", "list the dataset recipes and the catalog; `datasets check NAME`: preprocessing vs the paper"),
}
# stage subcommands that also serve a command outside the DAG, run when the stage's axes are not given:
# stage name -> the module (with add_arguments and standalone(args)): `r2m caption IMAGES` detects concepts
# in new photos
STANDALONE: dict[str, str] = {"caption": "r2m.caption_cli:standalone"}
# commands renamed: old name -> new name (the old one is refused in one line naming the new one, exit 2)
RENAMED: dict[str, str] = {"resolve-params": "stamps"}


def _load(spec: str):
    module, func = spec.split(":")
    return importlib.import_module(module), func


def call(spec: str, argv: list[str]) -> int:
    """Import ``module:function`` lazily and call it with the remaining arguments."""
    module, func = _load(spec)
    return int(getattr(module, func)(argv) or 0)


def warm(argv: list[str]) -> int:
    """``r2m warm``: the warm server (:mod:`r2m.warm.server`), handed what each of its jobs runs (:func:`main`)
    and the module that runs a stage imports besides the stage's own (preloaded with them)."""
    from r2m.warm import server

    return server.main(argv, target=main, modules=("r2m.pipeline.validate",))


def device_arg(text: str) -> str:
    """argparse type: auto, cpu, cuda, cuda:N or mps."""
    from r2m.runtime import check_device
    from r2m.utils.guard import BadInput

    try:
        return check_device(text)
    except BadInput:
        raise argparse.ArgumentTypeError(f"{text!r}: choose auto, cpu, cuda, cuda:N or mps") from None


def _next_steps(stage: S.Stage) -> str:
    """One line for ``--help``: what the stage writes and which stages read it next (from the registry)."""
    outs = [o.path for o in stage.outs.values()]
    readers = [st.name for st in S.STAGES
               if any((d.pattern if isinstance(d, S.Gather) else d) in outs for d in st.deps.values())]
    nxt = f"; read next by: {', '.join(dict.fromkeys(readers))}" if readers else ""
    return f"writes: {', '.join(outs)}{nxt}. Usually run through `snakemake` or `dvc repro` (docs/guide/running.md)."


def _stage_parser(stage: S.Stage, add_help: bool = True) -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"r2m {stage.name}", description=stage.help, add_help=add_help,
                      epilog=_next_steps(stage))
    for axis in stage.axes:
        if axis == "seed":  # the engines always name it; by hand, the single-seed run's
            p.add_argument("--seed", default="0", help="the run's seed (default 0; its files: s<seed>/)")
        else:
            p.add_argument(f"--{axis}", default=None, help=f"{axis} to run for")
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    p.add_argument("--device", type=device_arg, default=None, help="runtime: auto|cpu|cuda[:N] (env R2M_DEVICE)")
    p.add_argument("--threads", type=int, default=None, help="runtime: torch threads (env R2M_THREADS)")
    p.add_argument("--workers", type=int, default=None, help="runtime: data-loader workers (env R2M_WORKERS)")
    p.add_argument("--no-log-file", action="store_true", help="log to stderr only")
    p.add_argument("--force", action="store_true",
                   help="recompute even when nothing the last run read or wrote has changed (env R2M_FORCE=1)")
    return p


class AfterImport:
    """A one-shot ``sys.meta_path`` finder: ``hook()`` runs right after the module ``name`` is first
    imported (its code executed), or at once when it already is. Lets a stage set torch's threads
    (``Runtime.apply``) without importing torch itself: a stage that never uses torch (tables,
    evaluation, vocabularies...) skips its import (~1 s per job); one that does gets the same
    settings before its first torch op. Use as a context manager: leaving it drops a hook that
    never ran."""

    def __init__(self, name: str, hook) -> None:
        self.name, self.hook = name, hook

    def __enter__(self) -> AfterImport:
        if self.name in sys.modules:
            self.hook()
        else:
            sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the other finders
        if spec is None or spec.loader is None:
            return spec
        loader, hook = spec.loader, self.hook

        def exec_module(module) -> None:
            del loader.exec_module  # back to the loader's own method
            type(loader).exec_module(loader, module)
            hook()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class _Exit(Exception):  # noqa: N818  (an early end of a stage command, not an error)
    """A phase of :func:`run_stage` ended the command before the run (its one line, if any, already printed)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _refuse(stage: S.Stage, line: str) -> _Exit:
    """A command refused before any work: ``r2m <stage>: <line>`` on stderr, exit 2."""
    print(f"r2m {stage.name}: {line}", file=sys.stderr)
    return _Exit(2)


def run_stage(stage: S.Stage, argv: list[str]) -> int:
    """``r2m <stage> …``: parse, load the params, build the context, then run the instance guarded. Every early
    end is one line and exit 2 (or what a relaunch or a standalone command returns); the run's own ends are
    in :func:`_endings`."""
    try:
        module, func, args = _parse(stage, argv)
        params = _params(stage, args)
        ctx, log_path, force = _context(stage, args, params)
    except _Exit as done:
        return done.code
    return _guarded_run(ctx, params, module, func, log_path, force)


def _parse(stage: S.Stage, argv: list[str]) -> tuple[object, str, argparse.Namespace]:
    """Phase 1: the axes checked before importing heavy code (``--help`` waits for the stage's own options),
    then the implementation (or the standalone command when axes are missing) imported and the full command
    line parsed. Returns the implementation's module, its function's name and the parsed arguments."""
    from r2m import params as P

    pre, _ = _stage_parser(stage, add_help=False).parse_known_args(argv)
    checks = {  # axis -> (is the value allowed, what to say otherwise)
        "variant": (lambda v: v in P.VARIANT_NAMES, f"choose from {', '.join(P.VARIANT_NAMES)}"),
        "ckpt": (lambda v: v in P.TRAIN_STAGES, f"choose from {', '.join(P.TRAIN_STAGES)}"),
        "model": (lambda v: v in P.SUP_MODEL_NAMES, f"choose from {', '.join(P.SUP_MODEL_NAMES)}"),
        "seed": (lambda v: v.isascii() and v.isdigit() and int(v) <= P.MAX_SEED,
                 f"a run's seed is a non-negative integer, at most {P.MAX_SEED}"),
    }
    for axis, (allowed, hint) in checks.items():
        value = getattr(pre, axis) if axis in stage.axes else None
        if value is not None and not allowed(value):
            raise _refuse(stage, f"--{axis} {value!r}: {hint}")
    alone = stage.name in STANDALONE and any(getattr(pre, a) is None for a in stage.axes)
    from r2m.utils.reads import import_reads

    with import_reads():  # a library the module imports may read its data files now: the record names them
        module, func = _load(STANDALONE[stage.name] if alone else stage.impl)
    if hasattr(module, "relaunch"):  # e.g. training's --nproc N: re-run under torchrun
        rc = module.relaunch(stage.name, argv)
        if rc is not None:
            raise _Exit(int(rc))
    parser = _stage_parser(stage)
    if hasattr(module, "add_arguments"):
        module.add_arguments(parser)
    args = parser.parse_args(argv)
    missing = [a for a in stage.axes if getattr(args, a) is None]
    if missing:
        if hasattr(module, "standalone"):
            raise _Exit(int(module.standalone(args) or 0))
        parser.error(f"missing --{' --'.join(missing)}")
    return module, func, args


def _params(stage: S.Stage, args: argparse.Namespace):
    """Phase 2: the params loaded and checked, as the instance's dataset sees them: its own dataset's checks
    (not every selected one's: a stage loads what its instance needs), those of the stage's side (the
    baselines' feature weights for a supervised stage, R2M's files and the recipe's own check otherwise)."""
    from r2m import params as P
    from r2m.pipeline import validate as V

    try:
        params = P.load(args.params)
        if "dataset" in stage.axes:
            if args.dataset in params.catalog:
                check = V.check_sup_files if stage.source("dataset") == "baselines.datasets" else V.check_files
                check(params, args.dataset, args.params)
            params = P.for_dataset(params, args.dataset)
    except P.ParamsError as err:
        raise _refuse(stage, str(err)) from None
    return params


def _context(stage: S.Stage, args: argparse.Namespace, params):
    """Phase 3: runtime settings and names checked (one line each, before any work), the logger and the
    :class:`StageContext`; a finished input folder missing a key file is refused. Returns the context, the
    job's log file (None: stderr only) and whether the run is forced."""
    from r2m.runtime import STAGE_THREADS, Runtime, switch
    from r2m.stage.context import StageContext, setup_logging
    from r2m.utils.guard import BadInput, env_number, inside

    axes = {a: getattr(args, a) for a in stage.axes}
    try:
        runtime = Runtime.from_env(args.device, args.threads, args.workers, default_threads=STAGE_THREADS)
        force = args.force or switch("R2M_FORCE", "0")
        env_number("R2M_PROGRESS_SECONDS", 30.0, float, 0)
        log_path = None if args.no_log_file else inside(".", stage.log.format(**axes), "log")
    except BadInput as err:
        raise _refuse(stage, str(err)) from None
    log = setup_logging(None)  # the job's log file is opened once the instance's lock is held
    ctx = StageContext(stage=stage, params=params, runtime=runtime, log=log, args=args, **axes)
    damaged = ctx.incomplete_inputs()
    if damaged:  # a finished input folder missing a key file: refused before any work
        log.error("r2m %s: %s", stage.name, damaged[0])
        raise _Exit(2)
    return ctx, log_path, force


def _endings() -> tuple[tuple[type[BaseException], object, object], ...]:
    """How a guarded run ends on an exception, the first type that matches: (type, exit status or a function of
    the error giving it, a function of (stage name, error, network guard) giving the one line, or None for
    :func:`_report_failure`: the plain error's line, its traceback in the log)."""
    from r2m.utils.guard import BadInput, disk_full_message, is_disk_full
    from r2m.utils.netguard import NetworkRefused
    from r2m.utils.resume import Preempted, StageBusy

    return (
        (NetworkRefused, 1, lambda name, err, guard: f"r2m {name}: {err}"),
        (StageBusy, 75, lambda name, err, guard: f"r2m {name} refused: {err}"),  # 75: EX_TEMPFAIL
        # SIGTERM/SIGINT: state saved, plain message, non-zero exit
        (Preempted, lambda err: err.exit_code, lambda name, err, guard: f"r2m {name} {err}"),
        (KeyboardInterrupt, 130,
         lambda name, err, guard: f"r2m {name} interrupted (nothing of this run was kept as an output)"),
        (Terminated, lambda err: 128 + err.signum,
         lambda name, err, guard: f"r2m {name} stopped by {err} (nothing of this run was kept as an output)"),
        (BadInput, 2, lambda name, err, guard: f"r2m {name}: {err}"),
        (OSError, 1, lambda name, err, guard: f"r2m {name}: {disk_full_message(err)}" if is_disk_full(err) else None),
        # a failure that follows from a refused network access: that is the line
        (Exception, 1, lambda name, err, guard: f"r2m {name}: {guard.refused[0]}" if guard.refused else None),
    )


def _guarded_run(ctx, params, module, func: str, log_path: Path | None, force: bool) -> int:
    """Phase 4: the instance run under its lock, the writer check, the network guard and the recorder (or cut
    off early when nothing it read or wrote changed); an exception ends it as :func:`_endings` says."""
    from r2m.pipeline.network import guard_for
    from r2m.stage import record
    from r2m.stage.context import log_to_file
    from r2m.utils.owner import NotOwned, adopt_stage_outputs, owned_as, stage_kind
    from r2m.utils.resume import StageLock

    stage, args, axes, log = ctx.stage, ctx.args, ctx.axes, ctx.log
    # no network outside the download stages: an attempt fails the stage in one line naming what tried
    guard, may_download = guard_for(stage.name, params, axes.get("dataset"))
    threads = AfterImport("torch", ctx.runtime.apply)  # torch's threads, when (if) the stage imports torch
    t0 = time.perf_counter()
    shard = getattr(args, "shard", None)
    outs = ", ".join(str(p) for p in ctx.outs.values()) or stage.name
    extra = None if shard is None else f"shard{shard}"
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 holds the stage's lock, the others their own
        extra = f"{extra or ''}rank{os.environ['RANK']}"
    lock = StageLock(ctx.root, stage.name, axes, outs, extra=extra)
    # what the instance reads, recorded (.r2m/records/, r2m.stage.record) by one run of it (not a shard's)
    recording = shard is None and extra is None and os.environ.get("R2M_RECORD", "1") != "0"
    rec = None
    try:
        with threads, lock, owned_as(stage_kind(stage.name)), guard:  # one run per stage output (a second one is
            # refused at once, naming the holder, before it opens the log); the folders it writes are this stage's
            if log_path is not None:
                log_to_file(log, log_path)
            if may_download:
                log.info("a download stage: may fetch %s", may_download)
            log.info("r2m %s %s", stage.name, " ".join(f"{k}={v}" for k, v in axes.items()))
            refused = ctx.output_problems()  # before any work: under Snakemake the Snakefile's onstart checks too
            if refused:
                raise NotOwned(refused[0])
            for folder in adopt_stage_outputs([(p, stage.outs[k].adopt) for k, p in ctx.outs.items()
                                               if stage.outs[k].directory]):
                log.info("%s: an output of an older r2m (its marker names no kind, or it has none): adopted",
                         folder)
            if recording and not force:  # early cutoff: nothing it read or wrote changed since its last run
                last, why = record.up_to_date(ctx)
                if last is not None and not why:
                    record.mark_current(ctx, last)
                    log.info("up to date: nothing it read or wrote changed since its last run (early cutoff; "
                             "--force or R2M_FORCE=1 recomputes)")
                    return 0
            rec = record.start(ctx, args.params) if recording else None
            if rec is not None and "torch" in sys.modules:
                ctx.runtime.apply()  # torch came before the recording (a warm server's): its threads are read now
            getattr(module, func)(ctx)
            guard.check()  # a refusal a thread or a library swallowed still fails the stage
            if rec is not None:
                record.finish(rec, ctx)
    except BaseException as err:  # noqa: BLE001  (ended as the table says; anything else goes on up)
        ending = next((e for e in _endings() if isinstance(err, e[0])), None)
        if ending is None:
            raise
        _, code, line = ending
        text = line(stage.name, err, guard)
        if text is None:
            _report_failure(log, stage.name, err, log_path)
        else:
            log.error("%s", text)
        return code(err) if callable(code) else code
    finally:
        if rec is not None:
            rec.stop()  # a failed run: its hooks removed, no record written
    log.info("done in %.1f s", time.perf_counter() - t0)
    return 0


def _report_failure(log, stage: str, err: Exception, log_path: Path | None) -> None:
    """The traceback goes to the stage's log file (or to stderr when there is none, as under
    Snakemake, or with R2M_DEBUG=1); the last line is always the plain error message."""
    import logging
    import os
    import traceback

    tb = "".join(traceback.format_exception(err))
    if log_path is None or os.environ.get("R2M_DEBUG") == "1":
        sys.stderr.write(tb)
    files = [h for h in log.handlers if isinstance(h, logging.FileHandler)]
    for h in files:
        h.stream.write(tb)
        h.flush()
    where = f" (traceback in {log_path})" if files else ""
    msg = " ".join(str(err).split()) if "\n" in str(err).strip() else str(err)  # one line
    log.error("r2m %s failed: %s: %s%s", stage, type(err).__name__, msg, where)


def _usage() -> str:
    lines = ["usage: r2m <command> [options]", "", "pipeline stages (each a DAG step):"]
    lines += [f"  {s.name:<18} {s.help}" for s in S.STAGES]
    lines += ["", "tools:"]
    lines += [f"  {name:<18} {h}" for name, (_, h) in TOOLS.items()]
    lines += ["", "Run `r2m <command> --help` for a command's options.",
              "After `make run`: open reports/index.html; caption your own photos with `r2m caption IMAGES...`;",
              "compare two captioners with `r2m compare`. The user guide: docs/guide/README.md."]
    return "\n".join(lines)


class Terminated(BaseException):
    """SIGTERM/SIGHUP outside a stage's own handling (training saves its state itself): one line, 128 + N."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def _signals() -> dict[int, object]:
    """``ulimit -f`` gives EFBIG (a "disk full" line) instead of killing the process; SIGTERM/SIGHUP
    raise :class:`Terminated` (one line) unless a stage installs its own handler. Returns the
    handlers replaced (restored when :func:`main` returns)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    old: dict[int, object] = {}
    if hasattr(signal, "SIGXFSZ"):
        old[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            old[sig] = signal.signal(sig, _raise_terminated)
    return old


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from r2m import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    from r2m.utils.guard import BadInput, disk_full_message, is_disk_full, os_error_line

    if name in S.BY_NAME:  # under `r2m warm`: the job runs in a fork of the warm server
        from r2m.warm.client import run as run_warm

        rc = run_warm(argv)
        if rc is not None:
            return rc
    old_handlers = _signals()
    try:
        if name in S.BY_NAME:
            return run_stage(S.BY_NAME[name], rest)
        if name in TOOLS:
            return call(TOOLS[name][0], rest)
    except KeyboardInterrupt:  # Ctrl-C before/after a stage's own handling: no traceback
        print(f"r2m {name}: interrupted", file=sys.stderr)
        return 130
    except Terminated as err:
        print(f"r2m {name}: stopped by {err}", file=sys.stderr)
        return 128 + err.signum
    except BadInput as err:  # e.g. R2M_DEVICE=bogus in `r2m caption IMAGES`
        print(f"r2m {name}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # outside a stage's own handling, e.g. `logs` is a file: one line naming the path
        print(f"r2m {name}: {disk_full_message(err) if is_disk_full(err) else os_error_line(err)}", file=sys.stderr)
        return 1
    finally:
        import signal

        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
    if name in RENAMED:
        print(f"r2m {name}: renamed; run `r2m {RENAMED[name]}`", file=sys.stderr)
        return 2
    print(f"r2m: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
