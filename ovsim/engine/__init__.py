"""The discrete-event engine: streams, the block dispatcher, shared channels, collectives."""
