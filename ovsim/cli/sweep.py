"""``ovsim sweep``: axes from the command line."""

from __future__ import annotations

import argparse
import math
from typing import Any

from ovsim.cli.common import (
    TABLE_NOTE,
    Progress,
    cell_text,
    check_extension,
    check_output,
    check_plot,
    json_text,
    save_plot,
    split_slowdown,
)
from ovsim.errors import OvsimError
from ovsim.files import atomic_output

# (column, header, format) of the sweep table, after the axes.
_SWEEP_COLUMNS: list[tuple[str, str, str]] = [
    ("makespan_s", "iter ms", "ms"), ("compute_s", "compute ms", "ms"), ("contention_slowdown", "contention", "pct"),
    ("compute_clock_slowdown", "clock", "pct"), ("comm_s", "comm ms", "ms"), ("exposed_comm_s", "exposed ms", "ms"),
    ("comm_hidden_fraction", "hidden", "frac"),
    ("power_limit_w", "limit W", "w"), ("avg_power_w", "avg W", "w"), ("peak_100ms_power_w", "peak W", "w"),
    ("energy_j", "energy J", "j"), ("memory_per_gpu_bytes", "mem GB", "gb"),
]


def _axis_text(value: Any) -> str:
    """An axis value as ``--axis`` takes it: null, true/false, numbers without a trailing .0."""
    if value is None or (isinstance(value, float) and value != value):
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def _sweep_table(df: Any, axes: list[str]) -> str:
    df = split_slowdown(df)
    cols = [c for c in _SWEEP_COLUMNS if c[0] in df.columns]
    widths = [max(len(a), *(len(_axis_text(v)) for v in df[a])) for a in axes]
    head = " ".join(f"{a:<{w}}" for a, w in zip(axes, widths, strict=True))
    lines = [head + " " + " ".join(f"{h:>10}" for _, h, _ in cols)]
    lines.append("-" * len(lines[0]))
    for rec in df.to_dict(orient="records"):
        vals = " ".join(f"{_axis_text(rec[a]):<{w}}" for a, w in zip(axes, widths, strict=True))
        cells = [cell_text(rec.get(key), kind) for key, _, kind in cols]
        lines.append(vals + " " + " ".join(cells))
    return "\n".join([*lines, "", TABLE_NOTE])


def run_sweep(args: argparse.Namespace) -> int:
    from ovsim.sweep import sweep

    check_output(args.csv, "--csv")
    check_extension(args.csv, "--csv", (".csv",), "CSV")
    check_plot(args.plot)
    axes: dict[str, list[Any]] = {}
    for item in args.axis:
        path, sep, values = item.partition("=")
        path = path.strip()
        if not sep or not path or not values.strip():
            raise OvsimError(f"expected PATH=VALUE[,VALUE...], got '{item}'", field="--axis")
        if path in axes:
            raise OvsimError(f"'{path}' is given twice", field="--axis")
        axes[path] = [axis_value(v, item) for v in _split_values(values, item)]
    bar = Progress(args.quiet or args.json)
    n = math.prod(len(v) for v in axes.values())
    bar.stage(f"predicting {n} combinations")
    try:
        df = sweep(args.scenario, axes, mode=args.mode, workers=args.workers, max_ops=args.max_ops,
                   max_combinations=args.max_combinations, scheduler=args.scheduler, results=args.results,
                   progress=(lambda done, total: bar.count("sweeping", done, total, "combinations"))
                   if bar.on else None)
    finally:
        bar.done()
    if args.csv:
        try:
            with atomic_output(args.csv) as tmp:
                df.to_csv(tmp, index=False)
        except OSError as e:
            raise OvsimError(f"cannot write: {e.strerror}", source=args.csv, field="--csv") from None
    if args.plot:
        from ovsim.plot_tables import sweep_figure

        save_plot(sweep_figure(df, list(axes), title=str(args.scenario)), args.plot)
    kept = df.attrs.get("results_kept")
    if args.json:
        doc: dict[str, Any] = {"axes": list(axes), "points": df.to_dict(orient="records")}
        if kept is not None:
            doc["results"] = {"folder": args.results, "read_back": kept, "predicted": len(df) - kept}
        print(json_text(doc))
    elif not args.quiet:
        print(_sweep_table(df, list(axes)))
        if kept is not None:
            print(f"results    {args.results}: {kept} of {len(df)} combinations read back, {len(df) - kept} predicted")
    return 0


def _split_values(text: str, item: str) -> list[str]:
    """Comma-separated values; a comma inside brackets belongs to a list value ([64, 64, 32])."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if depth < 0:
            raise OvsimError(f"unbalanced brackets in '{item}'", field="--axis")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise OvsimError(f"unbalanced brackets in '{item}'", field="--axis")
    out.append(cur)
    if any(not v.strip() for v in out):
        raise OvsimError(f"an empty value in '{item}'", field="--axis")
    return [v.strip() for v in out]


def axis_value(text: str, item: str) -> Any:
    """A value as a scenario file would hold it: null, true/false, a number (1e8 too, which YAML
    reads as a string), a [list] or {mapping} in YAML flow style, or else the text. ``none`` is
    text, as in YAML (an enum value such as ``tp_overlap: none``); only ``null`` and ``~`` are null."""
    import yaml

    low = text.lower()
    if low in ("null", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            x = kind(text)
        except ValueError:
            continue
        if isinstance(x, float) and not math.isfinite(x):
            raise OvsimError(f"'{text}' is not a finite number in '{item}'", field="--axis")
        return x
    if text[0] in "[{":
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise OvsimError(f"cannot read '{text}' in '{item}' as a YAML list or mapping", field="--axis") from None
    return text
