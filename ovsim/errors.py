"""The one exception type ovsim raises for bad input.

Every error names the file (or object) it came from and the field that is wrong, so the command
line can print a single line and exit non-zero instead of a traceback.
"""


class OvsimError(Exception):
    """Bad input: a file, field and message that print as one line."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.message = message
        self.source = source
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        prefix = ": ".join(parts)
        text = f"{prefix}: {self.message}" if prefix else self.message
        return " ".join(text.split())

    def located(self, source: str) -> "OvsimError":
        """The same error, attributed to `source` when it had no file yet."""
        if self.source:
            return self
        return OvsimError(self.message, source=source, field=self.field)
