"""Trace importers into the canonical kernel table, and exporters (Perfetto / Chrome trace JSON)."""

# The trace formats ovsim reads (ovsim.traces.load opens them). Named here, free of imports, so that
# building the command line's parser does not import pandas.
FORMATS: tuple[str, ...] = ("auto", "kineto", "nsys-sqlite", "nsys-csv", "parquet")
