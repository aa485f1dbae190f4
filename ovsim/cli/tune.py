"""``ovsim tune``: the best schedule for a scenario, ranked with the others the search confirmed."""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from ovsim.cli.common import Progress, check_extension, check_output, check_plot, json_text, save_plot
from ovsim.errors import OvsimError
from ovsim.files import atomic_output

# (column, header, format, scale) of the ranked table, after the knobs; the estimate is in the
# objective's unit (_ESTIMATE).
_COLUMNS = (("makespan_s", "iter ms", "{:.3f}", 1e3), ("bound_s", "bound ms", "{:.3f}", 1e3),
            ("energy_j", "energy J", "{:.4g}", 1.0), ("estimate", "", "{:.4g}", 1.0),
            ("change_pct", "vs given", "{:+.1f}%", 1.0))
_ESTIMATE = {"time": ("est. ms", 1e3), "energy": ("est. J", 1.0), "edp": ("est. J s", 1.0)}


def tune_table(result: Any, rows: int) -> str:
    """The ranked schedules: the knobs the search varied, then time, energy, bound and the
    objective's change against the scenario as given."""
    from ovsim.tune import knob_value

    df = result.table.head(rows)
    given = result.table[result.table["as_given"]]
    # The knobs that vary among the rows shown or differ there from the scenario as given.
    knobs = [k for k in result.stats["space"]
             if df[k].map(str).nunique() > 1 or (len(given) and str(given[k].iloc[0]) != str(df[k].iloc[0]))]
    est_head, est_scale = _ESTIMATE[result.stats["objective"]]
    columns = [(c, h or est_head, fmt, est_scale if c == "estimate" else f) for c, h, fmt, f in _COLUMNS]
    heads = ["#", *(k.rsplit(".", 1)[-1] for k in knobs), *(h for _, h, _, _ in columns)]
    cells = []
    pad = " " if df["as_given"].any() else ""  # ranks stay aligned beside a marked one
    for rec in df.to_dict(orient="records"):
        mark = "*" if rec["as_given"] else pad
        cells.append([f"{rec['rank']}{mark}", *(knob_value(k, rec[k]) for k in knobs),
                      *(fmt.format(rec[c] * f) if rec[c] == rec[c] else "-" for c, _, fmt, f in columns)])
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def tune_text(result: Any, scenario: str, rows: int) -> str:
    st = result.stats
    cut = f" (stopped at half of --budget-s {st['budget_s']:g})" if st["sampling_stopped"] else ""
    sampled = f"sampled by TPE in {st['trials']:,} trials{cut}; " if st["sampled"] else ""
    added = "; and the scenario as given, whose values the space lacks" if st["given_added"] else ""
    search = (f"{st['grid']:,} combinations, {st['candidates']:,} searched "
              f"({sampled}{st['redundant']} redundant, {st['invalid']} invalid, "
              f"{st['unfit']} do not fit memory, {st['failed']} failed{added})")
    # A sampled search knows nothing of the combinations it did not draw.
    other = "no other sampled schedule's" if st["sampled"] else "no other schedule's"
    within = f" by more than {100 * st['tolerance']:.3g}% of its bound" if st.get("tolerance") else ""
    pruned = (f"{other} time bound could beat the best{within}" if st["objective"] == "time" else
              f"{other} estimate came within 5% of the best")
    stop = pruned
    # How much better those left could be: the best found over their least bound (time only).
    gap = st["gap_pct"]
    by = f", by at most {gap:.1f}% (their least bound)" if math.isfinite(gap) else ""
    if st["stop"] == "confirm_max":
        stop = (f"stopped at --confirm-max: {st['could_still_win']} more could have won{by} (--confirm-max "
                f"{st['engine_predictions'] - 1 + st['could_still_win']} would finish it)")
    elif st["stop"] == "budget_s":
        stop = f"stopped at --budget-s {st['budget_s']:g}: {st['could_still_win']} more could have won{by}"
    bound = ("" if not st["bound_violations"] else
             f"; the time bound failed on {st['bound_violations']} of them: pruning may have missed a better one")
    lines = [f"scenario   {scenario}  (objective: {st['objective']})", f"space      {search}",
             f"predicted  {st['analytic_predictions']:,} analytic, {st['engine_predictions']} with the engine"
             + (f" ({st['engine_shared']} more had the same workload as one of them)"
                if st.get("engine_shared") else "")
             + f"; {stop}{bound}",
             *(f"           {what}, e.g. {st[key]}" for what, key in (("invalid", "invalid_example"),
                                                                       ("failed", "failed_example")) if st.get(key)),
             _given_line(result), "", tune_table(result, rows),
             # The mark is explained where a row shown carries it; the 'as given' line gives its rank.
             "(" + ("* the scenario as given; " if result.table.head(rows)["as_given"].any() else "")
             + "bound: a time the engine cannot beat (no contention but the waits for SMs, at the top clock); "
             "est.: the analytic fidelity's objective (no contention, no waits); "
             "vs given: the objective's change against the scenario as given)", "", "why"]
    lines += [f"{i}. {w}" for i, w in enumerate(result.why, 1)]
    return "\n".join(lines)


def _given_line(result: Any) -> str:
    st, table = result.stats, result.table
    if st.get("given_problem"):
        return f"as given   not ranked: {st['given_problem']}"
    row = table[table["as_given"]].iloc[0]
    return (f"as given   {row['makespan_s'] * 1e3:.3f} ms, {row['energy_j']:.4g} J: rank {row['rank']} of the "
            f"{len(table)} the engine ranked")


def run_tune(args: argparse.Namespace) -> int:
    from ovsim.tune import read_space, scenario_yaml, tune

    check_output(args.output, "--output")
    check_extension(args.output, "--output", (".yaml", ".yml"), "YAML")
    check_plot(args.plot)
    space = read_space(args.space) if args.space else None
    # The budget is the command's: what loading the modules and the space took is spent already (a
    # sliver is left where that was all of it, so the scenario as given is still predicted).
    budget_s = args.budget_s
    if budget_s is not None:
        budget_s = max(budget_s - (time.monotonic() - args.started_s), 1e-3)
    bar = Progress(args.quiet or args.json)
    bar.stage("searching schedules")
    try:
        result = tune(args.scenario, space=space, objective=args.objective, top=args.top, workers=args.workers,
                      confirm_max=args.confirm_max, max_grid=args.max_grid, space_source=args.space or "space",
                      scheduler=args.scheduler, budget_s=budget_s, tolerance=args.tolerance,
                      progress=lambda what, done, total: bar.count(what, done, total, "schedules"))
    finally:
        bar.done()
    # The output speaks of the budget given; the search's own share stays in the stats.
    result.stats["search_budget_s"], result.stats["budget_s"] = budget_s, args.budget_s
    if args.output:
        try:
            with atomic_output(args.output) as tmp:
                # The file keeps the scenario's name and description: a comment says what changed.
                why = f"# ovsim tune's best schedule for {args.scenario}: {result.why[0]}\n" if result.why else ""
                tmp.write_text(why + scenario_yaml(result.best_mapping, args.scenario, args.output))
        except OSError as e:
            raise OvsimError(f"cannot write: {e.strerror}", source=args.output, field="--output") from None
    if args.plot:
        _plot(result, args.plot, args.scenario)
    if args.json:
        print(json_text({"stats": result.stats, "schedules": result.table.to_dict(orient="records"),
                         "why": result.why, "best": result.best_mapping}))
    elif not args.quiet:
        print(tune_text(result, args.scenario, args.rows))
        if args.output:
            print(f"\nbest schedule written to {args.output}")
    return 0


def _plot(result: Any, path: str, scenario: str) -> None:
    """The leaders' timelines (predicted again with the engine: the search keeps only summaries)."""
    from ovsim.api import predict
    from ovsim.plot import leaders_figure

    timelines = [(f"{i}. {line.split(':', 1)[0]}", predict(c.scenario, mode="simulate", counters=False).timeline)
                 for i, (c, line) in enumerate(zip(result.leaders, result.why, strict=True), 1)]
    save_plot(leaders_figure(timelines, title=f"{scenario}: leading schedules"), path)
