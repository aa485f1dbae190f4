"""The parser of every command, and ``main``: one line for every error, an exit status for every outcome."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from importlib import import_module

from ovsim.cli.common import (
    Parser,
    at_least_one,
    count_arg,
    file_name,
    finite,
    max_ops_flag,
    non_negative,
    positive,
    share,
    strict_flag,
)
from ovsim.errors import OvsimError
from ovsim.limits import MAX_COMBINATIONS
from ovsim.traces import FORMATS


def _command(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """Command ``name`` of ``ovsim.cli.<module>``, imported when it runs: a command loads its own
    modules only (the others' cost a prediction's start-up)."""
    def run(args: argparse.Namespace) -> int:
        return int(getattr(import_module(f"ovsim.cli.{module}"), name)(args))

    run.__name__ = name
    return run


def parser() -> argparse.ArgumentParser:
    from ovsim import __version__

    p = Parser(prog="ovsim", description="Predict compute-communication overlap on GPUs.",
                epilog="exit status: 0 success; 1 a check of 'ovsim validate' failed; 2 bad input, a usage "
                       "error or an output that cannot be written; 3 internal error; 130 interrupted")
    p.add_argument("--version", action="version", version=f"ovsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("predict", help="predict a scenario file")
    pr.add_argument("scenario", help="scenario YAML file")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument("--timeline", metavar="FILE", type=file_name, help="write a Perfetto-loadable trace")
    pr.add_argument("--plot", metavar="FILE", type=file_name,
                    help="draw the timeline (a lane per rank and stream, slowed time hatched by reason) and the "
                         "resource counters to FILE (PNG, PDF or SVG, from the name; needs matplotlib)")
    pr.add_argument("--plot-ranks", metavar="N", type=at_least_one, default=4,
                    help="ranks drawn by --plot (default 4)")
    pr.add_argument("--mode", choices=["simulate", "analytic"], help="override the scenario's mode")
    pr.add_argument("--rows", type=count_arg, default=40, help="ops shown in the table (default 40)")
    pr.add_argument("--power-cap-w", type=positive, metavar="W",
                    help="board power limit (as nvidia-smi -pl), within the GPU's settable range")
    pr.add_argument("--sm-clock-hz", type=positive, metavar="HZ",
                    help="locked SM clock (as nvidia-smi -lgc), e.g. 1.2e9, within the GPU's clock range")
    pr.add_argument("--power-start", choices=["steady", "idle"],
                    help="where the power-limit loop starts: steady (default: the workload repeated, as a training "
                         "loop) or idle (a GPU that has idled, as a benchmark's first run)")
    pr.add_argument("--no-power-management", action="store_true",
                    help="no power-limit loop (by default it runs at the GPU's default limit): every kernel at its "
                         "calibrated rate, power only reported, as no real board runs")
    pr.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    pr.add_argument("--all-ranks", action="store_true",
                    help="--json's ops and --timeline cover every rank of the job, not only the ranks simulated for "
                         "the others (rank symmetry, docs/design.md); at most --max-ops rows")
    max_ops_flag(pr)
    pr.set_defaults(func=_command("predict", "run_predict"))
    cp = sub.add_parser("compare", help="predict several scenarios and compare them side by side")
    cp.add_argument("scenarios", nargs="+", help="scenario YAML files; the first is the baseline")
    cp.add_argument("--mode", choices=["simulate", "analytic"], help="override the scenarios' mode")
    cp.add_argument("--json", action="store_true", help="print one JSON object")
    cp.add_argument("--plot", metavar="FILE", type=file_name,
                    help="draw each scenario's makespan (compute alone, slowdown, exposed communication, idle) and "
                         "power to FILE (PNG, PDF or SVG, from the name; needs matplotlib)")
    cp.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    max_ops_flag(cp)
    cp.set_defaults(func=_command("predict", "run_compare"))
    sw = sub.add_parser("sweep", help="predict every combination of values of a scenario's fields")
    sw.add_argument("scenario", help="scenario YAML file")
    sw.add_argument("--axis", action="append", required=True, metavar="PATH=V1,V2,...",
                    help="a field of the scenario (keys joined by dots, a list item by index or name: "
                         "ops.gemm.m, training.micro_batch_size, power.cap_w, knobs.comm_priority) and its values "
                         "(null, true/false, numbers, text, [lists]); repeat for more axes, the first varying slowest")
    sw.add_argument("--mode", choices=["simulate", "analytic"], help="override the scenario's mode")
    sw.add_argument("--workers", type=count_arg, default=1, metavar="N",
                    help="processes to predict in (default 1; 0: one per CPU core)")
    sw.add_argument("--scheduler", metavar="ADDRESS",
                    help="a Dask scheduler (tcp://host:8786) to predict on its cluster (needs the 'cluster' extra; "
                         "also OVSIM_SCHEDULER)")
    sw.add_argument("--results", metavar="DIR", type=file_name,
                    help="keep each result in this folder as it finishes (parquet parts); run again with the same "
                         "folder, the sweep predicts only the combinations not in it yet")
    sw.add_argument("--json", action="store_true", help="print one JSON object")
    sw.add_argument("--csv", metavar="FILE", type=file_name, help="write the table, every summary column, as CSV")
    sw.add_argument("--plot", metavar="FILE", type=file_name,
                    help="draw makespan, compute slowdown, exposed communication and energy against the first "
                         "axis, a line per combination of the others (PNG, PDF or SVG; needs matplotlib)")
    sw.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    max_ops_flag(sw)
    sw.add_argument("--max-combinations", type=at_least_one, default=MAX_COMBINATIONS, metavar="N",
                    help=f"the most combinations run (default {MAX_COMBINATIONS:,}); more is refused before any work")
    sw.set_defaults(func=_command("sweep", "run_sweep"))
    tu = sub.add_parser("tune", help="search the schedule knobs a scenario leaves open for the best schedule")
    tu.add_argument("scenario", help="scenario YAML file")
    tu.add_argument("--objective", choices=["time", "energy", "edp"], default="time",
                    help="what to minimise: iteration time (default), energy, or energy x time")
    tu.add_argument("--space", metavar="FILE",
                    help="YAML mapping of knob paths (as sweep's --axis spells them) to lists of values: the only "
                         "knobs searched (default: every schedule knob the scenario leaves open, docs/tune.md)")
    tu.add_argument("-o", "--output", metavar="FILE", type=file_name, help="write the best schedule as a scenario")
    tu.add_argument("--plot", metavar="FILE", type=file_name,
                    help="draw the leaders' timelines side by side (PNG, PDF or SVG; needs matplotlib)")
    tu.add_argument("--top", type=at_least_one, default=5, metavar="N", help="leaders explained (default 5)")
    tu.add_argument("--rows", type=at_least_one, default=20, metavar="N",
                    help="schedules shown in the table (default 20)")
    tu.add_argument("--workers", type=count_arg, default=1, metavar="N",
                    help="processes to predict in (default 1; 0: one per CPU core)")
    tu.add_argument("--scheduler", metavar="ADDRESS",
                    help="a Dask scheduler (tcp://host:8786) to predict on its cluster; --workers: predictions at "
                         "once (needs the 'cluster' extra; also OVSIM_SCHEDULER)")
    tu.add_argument("--confirm-max", type=at_least_one, default=50, metavar="N",
                    help="the most schedules predicted with the engine besides the scenario as given (default 50)")
    tu.add_argument("--tolerance", type=share, default=0.0, metavar="SHARE",
                    help="for time: the pick may be up to this share above the best schedule in the space (0.05: "
                         "5%%), so that schedules whose bound comes within it of the best found are not predicted "
                         "with the engine (default 0: the best itself)")
    tu.add_argument("--max-grid", type=at_least_one, default=2000, metavar="N",
                    help="a larger space is sampled, N schedules by Optuna's TPE (default 2000)")
    tu.add_argument("--budget-s", type=positive, metavar="S",
                    help="the wall-clock budget in seconds, counted from when the command starts (not the "
                         "interpreter; --plot draws after it): a grid too slow to analyse in half of it "
                         "is sampled, and the engine stops confirming when it is spent (default: none)")
    tu.add_argument("--json", action="store_true", help="print one JSON object")
    tu.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    tu.set_defaults(func=_command("tune", "run_tune"))
    rp = sub.add_parser("replay", help="replay measured traces with contention and compare with the measurement")
    rp.add_argument("traces", nargs="+", help="trace files or folders (several files: ranks of one run)")
    rp.add_argument("--gpu", help="GPU spec name, when the trace's device name is unknown or to override it")
    rp.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: from the name)")
    rp.add_argument("--json", action="store_true", help="print one JSON object")
    rp.add_argument("--plot", metavar="FILE", type=file_name,
                    help="draw predicted against measured durations and the measured and predicted lanes to FILE "
                         "(PNG, PDF or SVG, from the name; needs matplotlib)")
    rp.add_argument("--plot-ranks", metavar="N", type=at_least_one, default=2,
                    help="ranks whose lanes --plot draws (default 2)")
    rp.add_argument("--timeline", metavar="FILE", type=file_name,
                    help="write measured and predicted tracks as a Perfetto trace")
    rp.add_argument("--rows", type=count_arg, default=30, help="overlapped kernels shown in the table (default 30)")
    rp.add_argument("--calibration", action="append", metavar="FILE",
                    help="calibration file on top of the shipped ones (repeatable); a folder stands for the "
                         "newest version in it of the GPU's file, as `ovsim calibrate -o FOLDER` writes them")
    rp.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    strict_flag(rp)
    rp.set_defaults(func=_command("replay", "run_replay"))
    cb = sub.add_parser("calibrate", help="fit model parameters to real traces; write a new calibration file")
    cb.add_argument("traces", nargs="+", help="traces, one run each (a file, a folder or tarball of ranks)")
    cb.add_argument("--gpu", required=True,
                    help="GPU spec the file is for; '*' fits the GPU-independent contention parameters from traces "
                         "of any GPU")
    cb.add_argument("-o", "--output", required=True, type=file_name,
                    help="file NAME.vN.yaml to write, or a folder (the GPU's next version is written there)")
    cb.add_argument("--fit", help="comma-separated quantities (contention, collectives, overhead, gemm, memory, "
                                  "power); default: every one the traces support, and an error if one named here "
                                  "cannot be fitted")
    # ovsim.calibrate.GEMM_FRAMES, spelled out: importing the fits here would slow every command.
    cb.add_argument("--gemm-frame", choices=("grid", "scenario"), default="grid",
                    help="where the GEMM fit prices each GEMM: at its measured grid (grid, the default: it "
                         "describes the traced kernels) or as a scenario GEMM of its problem on the library "
                         "kernel ovsim picks (scenario: the parameters for scenarios' GEMMs)")
    cb.add_argument("--trace-gpu", action="append", metavar="TRACE=GPU",
                    help="GPU spec of a trace that does not record its device (repeatable)")
    cb.add_argument("--power-log", action="append", metavar="[TRACE=]LOG",
                    help="power log (nvidia-smi CSV, dcgmi dmon, DCGM CSV) recorded during a trace's run; TRACE= "
                         "names the trace when there are several (repeatable)")
    cb.add_argument("--power-offset-s", type=finite,
                    help="trace time of the power logs' first sample (default: from the wall clocks of both)")
    cb.add_argument("--power-window-s", type=non_negative,
                    help="the power sensor's averaging window (default: the log's median sample interval)")
    cb.add_argument("--plot", metavar="FILE", type=file_name,
                    help="draw every point each fit used, measured against fitted, to FILE (PNG, PDF or SVG, "
                         "from the name; needs matplotlib)")
    cb.add_argument("--json", action="store_true", help="print one JSON object")
    cb.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    strict_flag(cb)
    cb.set_defaults(func=_command("calibrate", "run_calibrate"))
    ip = sub.add_parser("import", help="convert traces to the canonical kernel table (parquet)")
    ip.add_argument("traces", nargs="+", help="trace files or folders")
    ip.add_argument("-o", "--output", required=True, type=file_name, help="parquet file to write")
    ip.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: from the name)")
    ip.add_argument("--quiet", action="store_true", help="print nothing")
    strict_flag(ip)
    ip.set_defaults(func=_command("replay", "run_import"))
    vp = sub.add_parser("validate", help="reproduce published figures and replay real traces; one table")
    vp.add_argument("--traces", metavar="DIR", type=file_name,
                    help="folder holding the shared real traces (their layout as published)")
    vp.add_argument("--studies", action="store_true",
                    help="also predict the published overlap studies' configurations (about two minutes on one core)")
    vp.add_argument("--measured", action="store_true",
                    help="also replay the calibration harness's kernels measured beside communication-like kernels "
                         "(calibration/data/), held out: leave one victim kernel out, and another GPU; and check its "
                         "other measurements (power, clocks, GEMMs, copies, dispatch, HBM sharing) (about two "
                         "minutes)")
    vp.add_argument("--data", metavar="DIR", type=file_name,
                    help="the measured data sets for --measured (a checkout's calibration/data; default: the "
                         "checkout's, or the OVSIM_DATA environment variable's), e.g. from an installed wheel")
    vp.add_argument("--workers", type=count_arg, default=1, metavar="N",
                    help="processes to replay the held-out traces and measured kernels and predict the studies in "
                         "(default 1; 0: one per CPU core)")
    vp.add_argument("--json", action="store_true", help="print one JSON object")
    vp.add_argument("--plot", metavar="FILE", type=file_name,
                    help="draw every check's error against its tolerance to FILE (PNG, PDF or SVG, from the name; "
                         "needs matplotlib)")
    vp.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    vp.set_defaults(func=_command("calibrate", "run_validate"))
    sp = sub.add_parser("specs", help="list the known GPUs (SMs, clock, peak, memory, links, power) and systems")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=_command("calibrate", "run_specs"))
    return p


# Arguments naming files a command writes, and files or folders it reads.
_OUTPUTS = ("timeline", "plot", "csv", "output")


_INPUTS = ("scenario", "scenarios", "traces", "calibration", "power_log", "space")


def _refuse_clobber(args: argparse.Namespace) -> None:
    """An output that is also an input of the same command would be lost when written (a
    scenario overwritten by its own timeline): refused before any work."""
    from pathlib import Path

    inputs: list[Path] = []
    for name in _INPUTS:
        value = getattr(args, name, None)
        for x in value if isinstance(value, list) else [value] if value else []:
            # --power-log takes [TRACE=]LOG.
            inputs.append(Path(x.split("=", 1)[-1] if name == "power_log" else x))
    for name in _OUTPUTS:
        out = getattr(args, name, None)
        if not out:
            continue
        target = Path(out).resolve()
        for src in inputs:
            if target == src.resolve() or (target.exists() and src.exists() and os.path.samefile(target, src)):
                raise OvsimError(f"is also an input of this command ({src}); write to another file", source=out,
                                 field=f"--{name}")


def main(argv: Sequence[str] | None = None) -> int:
    started_s = time.monotonic()  # a command's budget (tune --budget-s) counts from here
    try:
        args = parser().parse_args(argv)
        args.started_s = started_s
    except SystemExit as e:
        # A usage error (one line, from Parser) or --help: the status argparse chose, returned
        # like every other outcome.
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        _refuse_clobber(args)
        code: int = args.func(args)
        return code
    except OvsimError as e:
        print(f"ovsim: error: {e.one_line()}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (head, less) went away: not an error; keep Python's flush at exit quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("ovsim: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # never a traceback for a user; the env var shows it to developers
        if _while_interrupted(e) or (isinstance(e, BrokenProcessPool) and _interrupted_meanwhile()):
            print("ovsim: interrupted", file=sys.stderr)
            return 130
        if os.environ.get("OVSIM_DEBUG"):
            raise
        print(f"ovsim: internal error: {type(e).__name__}: {' '.join(str(e).split())} "
              "(set OVSIM_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3


def _while_interrupted(error: BaseException) -> bool:
    """Whether ``error`` was raised while a Ctrl-C was being handled: a pool's ``with`` cannot
    join the thread whose start the Ctrl-C cut short, and its RuntimeError hid the interrupt."""
    seen: BaseException | None = error.__context__
    walked: set[int] = set()  # a context set by hand can loop
    while seen is not None and id(seen) not in walked:
        if isinstance(seen, KeyboardInterrupt):
            return True
        walked.add(id(seen))
        seen = seen.__context__
    return False


def _interrupted_meanwhile(wait_s: float = 0.5) -> bool:
    """Whether a Ctrl-C reaches this process within ``wait_s``. Ctrl-C interrupts the whole
    process group: a pool's workers end at once (workers._watch_parent), and the pool can report
    them gone before this process has taken its own interrupt."""
    try:
        time.sleep(wait_s)
    except KeyboardInterrupt:
        return True
    return False


def console() -> None:
    """The ``ovsim`` command itself: :func:`main`, then exit with its status. What the command
    leaves is frozen out of the cyclic collector first, since the process is about to end: the
    interpreter's collections at exit over the modules' objects (pydantic's schemas, numpy) took
    60-90 ms of the README example's 0.36-0.47 s. Files are closed where they are written, so no
    output waits for a collection. Not in :func:`main`, which tests call many times in one
    process."""
    code = main()
    gc.freeze()
    sys.exit(code)
