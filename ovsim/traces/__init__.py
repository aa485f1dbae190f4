"""Trace importers into the canonical kernel table, and exporters (Perfetto / Chrome trace JSON)."""
