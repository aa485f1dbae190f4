"""Reading trace files: one file, a folder of rank files or an archive, decompressed; and a JSON
document parsed in slices of its ``traceEvents`` list (Kineto's traces reach gigabytes: slices keep
the parsed objects small next to the file's bytes), with a whole-document fallback."""

from __future__ import annotations

import gzip
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ovsim.errors import OvsimError

# Slices of about this size keep the parsed objects of one slice (4-5x its size) small next to the
# file's bytes, which must be in memory anyway.
CHUNK_BYTES = 4 << 20


SEP = re.compile(rb"\}\s*,\s*\{")


class WholeParse(Exception):
    """The slicing did not work out for this file; parse it as one document instead."""


def decompress(data: bytes, source: str) -> bytes:
    if data[:2] != b"\x1f\x8b":
        if source.lower().endswith(".gz"):
            raise OvsimError("not gzip data, though the name ends .gz", source=source, field="gzip")
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        reason = "truncated" if isinstance(e, EOFError) else "corrupt"
        raise OvsimError(f"cannot decompress: {reason} gzip data ({e})", source=source, field="gzip") from None


def is_trace_name(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    # "._name" files are macOS resource forks that tar picks up beside the real file.
    return base.lower().endswith((".json", ".json.gz")) and not base.startswith("._")


def trace_inputs(path: Path) -> Iterator[tuple[str, str, bytes]]:
    """(source, file name, uncompressed bytes) for each trace file, one at a time."""
    if path.is_dir():
        # Subfolders too (a run's ranks are often one folder each), not hidden ones.
        files = sorted(p for p in path.rglob("*") if p.is_file() and is_trace_name(p.name)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise OvsimError("no trace files (*.json, *.json.gz) in the folder or its subfolders", source=str(path),
                             field="path")
        for f in files:
            yield str(f), f.name, decompress(read_bytes(f), str(f))
        return
    if path.name.lower().endswith((".tar.gz", ".tgz", ".tar")):
        yield from archive_inputs(path)
        return
    yield str(path), path.name, decompress(read_bytes(path), str(path))


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise OvsimError(f"cannot read: {e.strerror or e}", source=str(path), field="path") from None


def archive_inputs(path: Path) -> Iterator[tuple[str, str, bytes]]:
    found = False
    try:
        with tarfile.open(path, mode="r:*") as tar:
            # Iterating reads members in archive order, so a compressed archive is decompressed once.
            for member in tar:
                if not (member.isfile() and is_trace_name(member.name)):
                    continue
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                source = f"{path}::{member.name}"
                found = True
                yield source, member.name.rsplit("/", 1)[-1], decompress(handle.read(), source)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        # tarfile's "could not be opened" lists every compression it tried, one line each.
        why = "not a tar archive (plain, gzip, bzip2 or xz)" if "could not be opened" in str(e) else str(e)
        raise OvsimError(f"cannot read the archive: {why}", source=str(path), field="archive") from None
    if not found:
        raise OvsimError("no trace files (*.json, *.json.gz) in the archive", source=str(path), field="path")


def loads(data: bytes | memoryview, source: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise OvsimError(f"invalid JSON: {utf8_where(data) or e}", source=source, field="json") from None


def utf8_where(data: bytes | memoryview) -> str | None:
    """Where a document stops being UTF-8, as a line and column (orjson says line 1 column 1)."""
    raw = bytes(data)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        return f"byte {e.start} (line {line}, column {column}) is not valid UTF-8"
    return None


def skip_ws(raw: bytes, i: int) -> int:
    n = len(raw)
    while i < n and raw[i] in b" \t\r\n":
        i += 1
    return i


def try_list(parts: tuple[bytes | memoryview, ...]) -> list[Any] | None:
    try:
        value = orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


def parse_sliced(raw: bytes, on_events: Callable[[list[Any]], None]) -> dict[str, Any]:
    """Feed ``traceEvents`` to on_events a slice at a time; returns the rest of the document.

    A slice ends at a ``}`` followed by ``,`` and ``{``. Cut anywhere but between two events, the
    text has an unclosed string or bracket and does not parse, so parsing each slice proves the
    cut; when no cut proves out the caller parses the whole document instead."""
    key = raw.find(b'"traceEvents"')
    if key < 0:
        raise WholeParse
    colon = skip_ws(raw, key + len(b'"traceEvents"'))
    if colon >= len(raw) or raw[colon] != ord(":"):
        raise WholeParse
    open_at = skip_ws(raw, colon + 1)
    if open_at >= len(raw) or raw[open_at] != ord("["):
        raise WholeParse
    mv = memoryview(raw)
    p = open_at + 1
    n = len(raw)
    while p + CHUNK_BYTES < n:
        m = SEP.search(raw, p + CHUNK_BYTES)
        if m is None:
            break
        events = None
        for _ in range(8):
            events = try_list((b"[", mv[p:m.start() + 1], b"]"))
            if events is not None:
                break
            # That "},{" was inside a string or a nested list: try the next one.
            m = SEP.search(raw, m.end() - 1)
            if m is None:
                raise WholeParse
        if events is None:
            raise WholeParse
        on_events(events)
        p = m.end() - 1
    # The last slice: up to the last separator between events, then the last event alone, so that
    # finding the end of the array by trial parses only a short text. Separators after the array
    # (a list of objects among the trailing metadata) fail to parse and the one before is tried.
    seps = list(SEP.finditer(raw, p))
    for m in reversed(seps[-16:]):
        events = try_list((b"[", mv[p:m.start() + 1], b"]"))
        if events is not None:
            on_events(events)
            p = m.end() - 1
            break
    else:
        if seps:
            raise WholeParse
    close = skip_ws(raw, p)
    if close < n and raw[close] == ord("]"):
        end = close
        tail: list[Any] = []
    else:
        end = p - 1
        for _ in range(1000):
            end = raw.find(b"]", end + 1)
            if end < 0:
                raise WholeParse
            found = try_list((b"[", mv[p:end + 1]))
            if found is not None:
                tail = found
                break
        else:
            raise WholeParse
    try:
        meta = orjson.loads(b"".join((mv[:open_at], b"[]", mv[end + 1:])))
    except orjson.JSONDecodeError:
        raise WholeParse from None
    if not isinstance(meta, dict) or meta.get("traceEvents") != []:
        raise WholeParse
    on_events(tail)
    return meta


def json_type(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(v), "null")
