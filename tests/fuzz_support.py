"""The fuzzing campaign's cases and the properties every command must keep on them.

A case is a scenario or a trace, mutated from the bundled examples, and the command run on it. The
properties (what a user may rely on, whatever they feed in):

- no traceback: the exit status is 0, 1 or 2, never 3 (an internal error), and a refusal (2) is one
  line on stderr that starts ``ovsim: error:``;
- no exit status 0 on input that is invalid by construction (the case says so when it is);
- no file written except the outputs the command names;
- bounded time: a case ends within ``CASE_LIMIT_S`` (the size limits stop runaway work first).

Failures found are kept as files under tests/fuzz_corpus/ and replayed by the default test run.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ovsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TRACE = EXAMPLES / "traces" / "h100-gemm-beside-16-channels.json.gz"
CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
CASE_LIMIT_S = 60.0

# Mappings that are models with a fixed set of fields (an unknown key there is an error).
MODEL_PATHS: tuple[tuple[str, ...], ...] = ((), ("knobs",), ("training",), ("training", "parallel"), ("power",))
# Text fields whose values are names from a closed set.
ENUM_KEYS = frozenset({"kind", "precision", "schedule", "mode", "model", "pipeline", "dp_mode", "system",
                       "tp_overlap", "algorithm", "protocol", "engine"})
# Counts and sizes, which cannot be negative.
COUNT_KEYS = frozenset({"m", "n", "k", "size_bytes", "bytes", "micro_batch_size", "micro_batches", "layers", "tp",
                        "pp", "dp", "threads", "stages", "repeat", "registers_per_thread", "ranks", "nodes"})
ODD_VALUES: tuple[Any, ...] = ("abc", [1], {"a": 1}, True)


@dataclass
class Case:
    """A command on one input file; ``invalid``: the input is invalid by construction."""

    command: str  # predict, replay or import
    file_name: str
    data: bytes
    invalid: bool
    why: str
    args: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    rc: int
    err: str
    seconds: float
    stray_files: list[str]


def base_scenarios() -> list[tuple[str, dict[str, Any]]]:
    """The bundled example scenarios, training ones cut to two layers so a case runs in well under a
    second."""
    out = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        if "training" in doc:
            doc["training"]["layers"] = 2
            doc["training"]["micro_batches"] = min(int(doc["training"].get("micro_batches", 1)), 4)
        out.append((p.name, doc))
    return out


def leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) of a parsed document, mappings and lists included."""
    found: list[tuple[tuple[Any, ...], Any]] = [(path, doc)]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.extend(leaves(value, (*path, key)))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found.extend(leaves(value, (*path, i)))
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    for key in path[:-1]:
        doc = doc[key]
    del doc[path[-1]]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def mutate_scenario(doc: dict[str, Any], kind: str, pick: int, choice: int) -> tuple[dict[str, Any], bool, str]:
    """One mutation of a scenario: (new document, invalid by construction, what was done). ``pick``
    chooses the place, ``choice`` the value."""
    doc = copy.deepcopy(doc)
    places = [(p, v) for p, v in leaves(doc) if p]
    if kind == "unknown_key":
        models = [p for p in MODEL_PATHS if _get(doc, p) is not None]
        models += [("ops", i) for i in range(len(doc.get("ops", [])))]
        path = models[pick % len(models)]
        _get(doc, path)["no_such_field"] = 1
        return doc, True, f"unknown key under {path}"
    if kind == "odd_number":
        numbers = [(p, v) for p, v in places if _is_number(v)]
        if numbers:
            path, _ = numbers[pick % len(numbers)]
            odd = ODD_VALUES[choice % len(ODD_VALUES)]
            _set(doc, path, odd)
            return doc, True, f"{path} = {odd!r}"
    if kind == "bad_enum":
        enums = [(p, v) for p, v in places if p[-1] in ENUM_KEYS and isinstance(v, str)]
        if enums:
            path, _ = enums[pick % len(enums)]
            _set(doc, path, "no-such-value")
            return doc, True, f"{path} = 'no-such-value'"
    if kind == "negative":
        counts = [(p, v) for p, v in places if p[-1] in COUNT_KEYS and _is_number(v)]
        if counts:
            path, _ = counts[pick % len(counts)]
            _set(doc, path, -5)
            return doc, True, f"{path} = -5"
    if kind == "duplicate_op" and doc.get("ops"):
        doc["ops"].append(copy.deepcopy(doc["ops"][pick % len(doc["ops"])]))
        return doc, True, "an op given twice"
    if kind == "scale":
        numbers = [(p, v) for p, v in places if _is_number(v)]
        if numbers:
            path, value = numbers[pick % len(numbers)]
            factor = (0, 0.5, 2, 1000, 1e6, 1e12)[choice % 6]
            _set(doc, path, value * factor)
            return doc, False, f"{path} x {factor}"
    if kind == "null":
        path, _ = places[pick % len(places)]
        _set(doc, path, None)
        return doc, False, f"{path} = null"
    path, _ = places[pick % len(places)]
    _delete(doc, path)
    return doc, False, f"{path} deleted"


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        in_list = isinstance(doc, list) and isinstance(key, int) and key < len(doc)
        if (isinstance(doc, dict) and key in doc) or in_list:
            doc = doc[key]
        else:
            return None
    return doc


def scenario_case(doc: dict[str, Any], invalid: bool, why: str, output: int) -> Case:
    """``predict`` on a scenario, with one of: no output, ``--json``, a timeline file."""
    text = yaml.safe_dump(doc, sort_keys=False).encode()
    args, outputs = [], []
    if output == 1:
        args = ["--json"]
    elif output == 2:
        args, outputs = ["--timeline", "timeline.json"], ["timeline.json"]
    return Case("predict", "s.yaml", text, invalid, why, args, outputs)


def text_case(doc: dict[str, Any], cut: int, insert: int, byte: int) -> Case:
    """``predict`` on a scenario's text cut short or with one byte put in: valid or not, never a crash."""
    text = yaml.safe_dump(doc, sort_keys=False).encode()
    if cut % 2:
        text = text[: cut % max(len(text), 1)]
        why = f"cut at byte {cut % max(len(text), 1)}"
    else:
        at = insert % max(len(text), 1)
        text = text[:at] + bytes([byte % 256]) + text[at:]
        why = f"byte {byte % 256} put in at {at}"
    return Case("predict", "s.yaml", text, False, why)


def base_trace() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress(TRACE.read_bytes()))
    return doc


def trace_case(doc: dict[str, Any], kind: str, pick: int, choice: int, command: str) -> Case:
    """``replay`` or ``import`` on a mutated trace. Field mutations may leave a valid trace (a
    malformed event is skipped with a count); a damaged file never is."""
    args, outputs = (["--json"], []) if command == "replay" else (["-o", "out.parquet"], ["out.parquet"])
    raw = gzip.compress(json.dumps(doc).encode(), mtime=0)
    if kind == "truncate_gzip":
        at = 1 + pick % (len(raw) - 1)
        return Case(command, "t.json.gz", raw[:at], True, f"gzip cut at {at}", args, outputs)
    if kind == "flip_gzip":
        # Past the 10-byte header every byte is deflate data or the CRC and size, which gzip checks.
        at = 10 + pick % (len(raw) - 10)
        flipped = raw[:at] + bytes([raw[at] ^ (1 + choice % 255)]) + raw[at + 1:]
        return Case(command, "t.json.gz", flipped, True, f"gzip byte {at} flipped", args, outputs)
    if kind == "truncate_json":
        text = json.dumps(doc).strip().encode()
        at = pick % (len(text) - 1)
        return Case(command, "t.json.gz", gzip.compress(text[:at], mtime=0), True, f"JSON cut at {at}", args,
                    outputs)
    doc = copy.deepcopy(doc)
    events = doc.get("traceEvents", [])
    places = [(("traceEvents", i, *p), v) for i, ev in enumerate(events) for p, v in leaves(ev) if p]
    path, _ = places[pick % len(places)]
    if kind == "delete_field":
        _delete(doc, path)
        why = f"{path} deleted"
    else:
        odd = ("abc", -1, 1e30, None, [], {}, True, -1e-9, 2**63)[choice % 9]
        _set(doc, path, odd)
        why = f"{path} = {odd!r}"
    return Case(command, "t.json.gz", gzip.compress(json.dumps(doc).encode(), mtime=0), False, why, args, outputs)


def run_case(case: Case) -> Outcome:
    """Run the case's command in a fresh folder (its current directory) and report what happened."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / case.file_name).write_bytes(case.data)
        before = os.getcwd()
        err = io.StringIO()
        start = time.perf_counter()
        try:
            os.chdir(folder)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                rc = main([case.command, case.file_name, *case.args, "--quiet"])
        finally:
            os.chdir(before)
        seconds = time.perf_counter() - start
        allowed = {case.file_name, *case.outputs}
        stray = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                       and str(p.relative_to(folder)) not in allowed)
    return Outcome(rc, err.getvalue(), seconds, stray)


def violations(case: Case, out: Outcome) -> list[str]:
    """The properties the outcome breaks (empty: it keeps them all)."""
    found = []
    if out.rc not in (0, 1, 2):
        found.append(f"exit status {out.rc}: {out.err.strip()[:300]}")
    if out.rc == 2 and (not out.err.startswith("ovsim: error:") or out.err.strip().count("\n")):
        found.append(f"refusal not one 'ovsim: error:' line: {out.err.strip()[:300]!r}")
    if case.invalid and out.rc == 0:
        found.append(f"exit status 0 on invalid input ({case.why})")
    if out.stray_files:
        found.append(f"wrote files it was not asked for: {out.stray_files}")
    if out.seconds > CASE_LIMIT_S:
        found.append(f"took {out.seconds:.0f} s")
    return found


def save_to_corpus(case: Case, name: str) -> Path:
    """Keep a failing case as a regression file (its bytes, and a sidecar saying how to run it)."""
    CORPUS.mkdir(exist_ok=True)
    data_path = CORPUS / f"{name}-{case.file_name}"
    data_path.write_bytes(case.data)
    meta = {"command": case.command, "args": case.args, "outputs": case.outputs, "invalid": case.invalid,
            "why": case.why}
    (CORPUS / f"{name}.case.json").write_text(json.dumps(meta, indent=1) + "\n")
    return data_path


def corpus_cases() -> list[tuple[str, Case]]:
    cases = []
    for meta_path in sorted(CORPUS.glob("*.case.json")):
        name = meta_path.name.removesuffix(".case.json")
        meta = json.loads(meta_path.read_text())
        data = next(CORPUS.glob(f"{name}-*"))
        file_name = data.name.removeprefix(f"{name}-")
        cases.append((name, Case(meta["command"], file_name, data.read_bytes(), meta["invalid"], meta["why"],
                                 meta["args"], meta["outputs"])))
    return cases
