"""Helpers every command shares: argument types, output checks, tables' cells, JSON, progress."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from ovsim.errors import OvsimError
from ovsim.limits import MAX_OPS


def fmt_s(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    return f"{x * 1e3:.3f}"


def signed_pct(x: float) -> str:
    """A change in percent with its sign, never "-0.0%"."""
    return f"{round(x * 100, 1) + 0.0:+.1f}%"


# The tables' peak is over 100 ms, the interval at which nvidia-smi updates a board's reading (each
# reading averages ~25 ms of it, docs/power.md): the engine's instantaneous peak can sit far above
# the board's limit within a window, which the power-limit loop holds on averages (predict's text
# and --json give both).
TABLE_NOTE = ("contention: compute time lost beside other work, against alone at the same SM clock; clock: compute "
               "time lost to an SM clock below the calibration's (power limit or lock), negative where the clock "
               "runs above it; comm ms: communication kernels' time summed over each rank's streams, where "
               "exposed and hidden are of the time any of them ran; peak W: the highest 100 ms "
               "average per GPU, over the interval at which a board's reading is updated")


def split_slowdown(df: Any) -> Any:
    """The compute slowdown split into its contention and clock parts (they add up to it)."""
    if "compute_slowdown" in df.columns and "compute_clock_slowdown" in df.columns:
        return df.assign(contention_slowdown=df["compute_slowdown"] - df["compute_clock_slowdown"])
    return df


def cell_text(x: Any, kind: str) -> str:
    """A number of the compare and sweep tables, ten wide."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return f"{'-':>10}"
    if kind == "ms":
        return f"{x * 1e3:>10.3f}"
    if kind == "pct":
        return f"{signed_pct(x):>10}"
    if kind == "frac":
        return f"{x * 100:>9.1f}%"
    if kind == "j":
        return f"{x:>10.4g}"
    if kind == "gb":
        return f"{x / 1e9:>10.1f}"
    return f"{x:>10.1f}"


def pct_text(x: float) -> str:
    return f"{x:.1f}%" if math.isfinite(x) else "-"


class Progress:
    """A one-line progress display on stderr, only when it is a terminal and output is not quiet."""

    def __init__(self, quiet: bool) -> None:
        self.on = not quiet and sys.stderr.isatty()
        self.shown = False
        self.started: float | None = None  # when the first count of this verb came (bar)
        self.first = 0  # what was already done then (a resumed sweep)
        self.verb = ""  # what is counted: a new step starts the rate afresh

    def stage(self, text: str) -> None:
        if self.on:
            sys.stderr.write(f"\r\033[K{text}")
            sys.stderr.flush()
            self.shown = True

    def ops(self, done: int, total: int) -> None:
        self.stage(f"simulating {bar_text(done, total)} {done}/{total} ops")

    def count(self, verb: str, done: int, total: int, unit: str) -> None:
        """A bar of ``done`` of ``total`` ``unit`` and the time left at the rate so far."""
        now = time.monotonic()
        if self.started is None or verb != self.verb:
            self.started, self.first, self.verb = now, done, verb
        left = ""
        if self.first < done < total and now > self.started:
            rate = (done - self.first) / (now - self.started)
            left = f", {(total - done) / rate:.0f} s left"
        self.stage(f"{verb} {bar_text(done, total)} {done:,}/{total:,} {unit}{left}")

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def bar_text(done: int, total: int, width: int = 30) -> str:
    fill = int(width * done / total) if total else width
    return f"[{'#' * fill}{'.' * (width - fill)}]"


def skipped_text(skipped: dict[str, int]) -> str:
    """What the importer skipped, as "N reason, ..." ("" when nothing)."""
    return ", ".join(f"{v} {r}" for r, v in sorted(skipped.items()))


def check_output(path: str | None, flag: str, *, make_folders: bool = False) -> None:
    """Refuse an output path that cannot be written before any work is done for it (a replay or a
    fit can take minutes)."""
    from pathlib import Path

    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise OvsimError("is a folder; give a file name", source=path, field=flag)
    folder = p.parent
    if make_folders:
        # The nearest existing ancestor must be a folder to create the rest in.
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise OvsimError(f"folder '{folder}' {what}", source=path, field=flag)
    # A read-only folder (for new folders: the existing one they would go in) says so now, with
    # nothing left behind.
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise OvsimError(f"cannot write in folder '{folder}': {e.strerror}", source=path, field=flag) from None


def check_extension(path: str | None, flag: str, suffixes: tuple[str, ...], what: str) -> None:
    """An output's name must say its format: a trace named .csv would hold JSON."""
    if path is not None and not path.lower().endswith(suffixes):
        raise OvsimError(f"{flag} writes {what}; name it {' or '.join(suffixes)}", source=path, field=flag)


def check_plot(path: str | None) -> None:
    """A figure's file must be writable, its format known and matplotlib installed, before the work
    it draws."""
    if path is None:
        return
    from ovsim.plot import check_path

    check_output(path, "--plot")
    with errors_of_flag("--plot"):
        check_path(path)


def written_text(timeline: str | None, plot: str | None) -> str:
    """The line a command prints after its table for the files it wrote ("" for none)."""
    written = [f"{what} written to {path}" for what, path in (("timeline", timeline), ("plot", plot)) if path]
    return "\n" + "; ".join(written) if written else ""


def save_plot(fig: Any, path: str) -> None:
    from ovsim.plot import save

    with errors_of_flag("--plot"):
        save(fig, path)


def check_gpu(name: str | None, flag: str = "--gpu") -> None:
    from ovsim.hw.spec import load_gpu

    if name is not None:
        with errors_of_flag(flag):
            load_gpu(name)


@contextlib.contextmanager
def errors_of_flag(flag: str) -> Iterator[None]:
    """An error inside is the flag's: the value came from it, whatever field the code that checked
    it names."""
    try:
        yield
    except OvsimError as e:
        raise OvsimError(e.message, source=e.source, field=flag) from None


class Parser(argparse.ArgumentParser):
    """argparse with a usage error on one line, as every other error is (the usage is one --help
    away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ovsim: error: {' '.join(message.split())} (see '{self.prog} --help')\n")


def finite(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{text}'") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be a finite number, got '{text}'")
    return x


def positive(text: str) -> float:
    x = finite(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got '{text}'")
    return x


def non_negative(text: str) -> float:
    x = finite(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got '{text}'")
    return x


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: '{text}'") from None


def share(text: str) -> float:
    """A share from 0 to below 1 (a tolerance)."""
    x = finite(text)
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"must be a share from 0 to below 1 (0.05: 5%), got '{text}'")
    return x


def count_arg(text: str) -> int:
    n = _whole_number(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got '{text}'")
    return n


def strict_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="an event the importer would skip (malformed, or of a kind it cannot use) is an error")


def max_ops_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-ops", type=at_least_one, default=MAX_OPS, metavar="N",
                   help=f"the most ops a scenario may expand to, after ranks and repeats (default {MAX_OPS:,}); "
                        "more is refused before any work")


def at_least_one(text: str) -> int:
    n = _whole_number(text)
    if n < 1:  # a negative number too: "not negative" would suggest that 0 passes
        raise argparse.ArgumentTypeError(f"must be at least 1, got '{text}'")
    return n


def file_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    return text


def json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def json_text(obj: Any) -> str:
    """One JSON object; a number that is not finite (a MAPE with nothing scored, a change against a
    zero baseline) is null, since NaN and Infinity are not JSON and strict readers refuse them. The
    object is walked for them only where it holds one: a prediction's ops (``api.json_records``)
    come without, and a walk over 150,000 of them took seconds."""
    try:
        return json.dumps(obj, default=json_default, allow_nan=False)
    except ValueError:
        return json.dumps(nulled(obj), default=json_default, allow_nan=False)


def nulled(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: nulled(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [nulled(v) for v in x]
    if not isinstance(x, str | bytes | int) and hasattr(x, "item"):
        x = x.item()  # a numpy scalar
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def rows_text(rows: list[dict[str, Any]]) -> str:
    """A plain table: the first column left-aligned, the others right."""
    cols = list(rows[0]) if rows else []
    cells = [[("-" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]

    def line(xs: list[str]) -> str:
        return "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(xs, width, strict=True)))

    return "\n".join([line(cols), *(line(x) for x in cells)])
