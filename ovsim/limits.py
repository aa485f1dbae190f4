"""Default limits on the size of a run, checked before any work (a command's flag raises them).

``MAX_OPS``: the ops (kernels, transfers, delays, after ranks and repeats) one scenario may expand
to. Each costs about 2 KB and a million take minutes to simulate, so a mistyped ``repeat`` stops
at once, with its size, instead of filling memory (``--max-ops``).

``MAX_OP_S``: the longest one op may take alone (a kernel, collective, copy or host gap, as
priced). Float seconds keep a tenth of a microsecond up to it, which the engine's microsecond
kernels need beside it; an op longer than 30 years is a mistyped size, refused with its name.

``MAX_COMBINATIONS``: the combinations one sweep runs, each a whole prediction
(``--max-combinations``).
"""

MAX_OPS = 1_000_000
MAX_OP_S = 1e9
MAX_COMBINATIONS = 10_000
