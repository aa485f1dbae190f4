"""Outputs written whole or not at all.

Every file a command writes goes to a temporary file beside it first and takes the final name in
one rename, so an interrupted or failed run leaves the old file as it was (or none), never a
truncated one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ovsim.errors import OvsimError

# The process's umask, read once: a temporary file is created private (0600), and the output
# should get the permissions a plain open() would have given it.
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_output(path: str | Path, *, exclusive: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write in place of ``path`` (same folder and extension, so that
    writers that read the format from the name still do); when the block ends without an error
    it becomes ``path``. ``exclusive``: never replace an existing file (an error instead)."""
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    except OSError as e:
        raise OvsimError(f"cannot write: {e.strerror}", source=str(path), field="output") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)
        if exclusive:
            _link(tmp, path)
            tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _link(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the name ``path``, never replacing a file that has it: a hard link fails where
    ``path`` exists, where a rename would replace it."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OvsimError("exists: not replaced", source=str(path), field="output") from None
    except OSError:
        # A file system without hard links: a rename, once the name is seen to be free.
        if path.exists():
            raise OvsimError("exists: not replaced", source=str(path), field="output") from None
        os.replace(tmp, path)
