"""A core attention with context parallelism (``training.parallel.cp`` > 1): each rank holds two of
the sequence's 2 x cp chunks, the i-th and the (2cp - 1 - i)-th, so that under the causal mask the
ranks do equal work (Transformer Engine's DualChunkSwap), and exchanges keys and values with the
other ranks of its group in one of three ways (``cp_comm``):

- ``all_gather`` (Llama 3, arXiv 2407.21783, section 3.3.2; Transformer Engine's
  ``AttnFuncWithCPAndKVAllGather``): the keys and the values all-gathered before the attention
  (forward, recomputed and backward), put in chunk order, the rank's queries run against the whole
  sequence; after the backward the keys' and values' gradients summed from its two chunks and
  reduce-scattered. Exposed: the attention waits for its gathers.
- ``p2p`` (ring attention; Transformer Engine's ``AttnFuncWithCPAndKVP2P``, Megatron-LM's default
  ``--cp-comm-type``): cp steps, each attending to the key/value block the rank holds while passing
  it on to the next rank of the ring (the block of step i + 1 arrives during step i). Step 0 is the
  rank's own block under the causal mask; each later one a quarter of its block's products,
  unmasked: on rank c, c steps of its whole queries against the first half of a block and then
  cp - 1 - c of its second chunk's queries against a whole block. Each step waits for the block
  its ring neighbour passed on, so a step runs at its slowest rank's pace, for which the rank
  simulated stands: each later step is priced as the slower of the two shapes
  (``AttentionOp.ring_step``). The forward corrects its output after each step; the backward
  passes the key/value gradients round with the blocks (keys and values first, both then, the
  gradients alone last: Transformer Engine's buffers), each exchange starting once the step
  before has added its gradients.
- ``a2a`` (DeepSpeed-Ulysses, Jacobs et al., arXiv 2309.14509; Transformer Engine's
  ``AttnFuncWithCPAndQKVOA2A``): the queries, keys and values each all-to-all'd from a split of
  the sequence to a split of the heads, the attention of the whole sequence over the rank's 1/cp
  of its heads, the output all-to-all'd back; in the backward the output's gradient goes to the
  heads' split and the queries', keys' and values' gradients come back. A tensor-parallel rank's
  query and key/value heads must divide by cp. Exposed, as the gathers.

The attention's kernels are :class:`ovsim.models.op_specs.AttentionOp`; the exchanges run on
stream ``cp``."""

from __future__ import annotations

from typing import Any, Protocol

from ovsim.models.op_specs import AttentionOp
from ovsim.models.training_layout import Layout
from ovsim.models.training_spec import ModelShape, TrainingSpec, rank_heads


class Emitter(Protocol):
    """What these functions use of :class:`ovsim.models.training_emit.LayerEmitter`."""

    spec: TrainingSpec
    m: ModelShape
    lay: Layout
    act_b: int
    comm: bool

    def compute(self, st: Any, cls: type[AttentionOp], **fields: Any) -> str: ...

    def mem(self, st: Any, name: str, nbytes: float, kind: Any) -> str: ...

    def collective(self, st: Any, name: str, kind: Any, size: float, stream: str, groups: list[list[int]],
                   engine: Any = "sm", after: list[str] | None = None,
                   after_each: list[str] | None = None) -> list[str]: ...


def cp_attention(g: Emitter, st: Any, s: int, name: str, backward: bool) -> None:
    """The core attention of one micro-batch on one rank of stage ``s`` with context parallelism."""
    if g.comm and g.spec.parallel.cp_comm == "p2p":
        _ring(g, st, s, name, backward)
        return
    if g.spec.parallel.cp_comm == "a2a":
        _heads_split(g, st, s, name, backward)
        return
    if g.comm:
        _gather(g, st, s, name)
    m, cp = g.m, g.lay.cp
    _attention(g, st, name, m.seq_len // cp, m.seq_len, True, backward)
    if backward and g.comm:
        _reduce(g, st, s, name)


def _attention(g: Emitter, st: Any, name: str, queries: int, keys: int, causal: bool, backward: bool,
               head_split: int = 1, ring_step: bool = False) -> str:
    m = g.m
    return g.compute(st, AttentionOp, name=name, kind="attention", batch=g.spec.micro_batch_size,
                     heads=m.heads // g.lay.tp // head_split, seq_len=queries, kv_len=keys if keys != queries else None,
                     head_dim=m.hidden // m.heads, causal=causal, precision=g.spec.attention_precision,
                     backward=backward, implementation=g.spec.attention_kernel, ring_step=ring_step)


def _kv_bytes(g: Emitter, tokens: int) -> float:
    """Bytes of the keys, or the values, of ``tokens`` tokens a sequence on one tensor-parallel
    rank (its share of the key/value heads, :func:`rank_heads`)."""
    return _head_bytes(g, tokens, rank_heads(g.m, g.lay.tp)[1])


def _q_bytes(g: Emitter, tokens: int) -> float:
    """Bytes of the queries, or the attention's output, of ``tokens`` tokens a sequence on one
    tensor-parallel rank (its share of the heads, :func:`rank_heads`)."""
    return _head_bytes(g, tokens, rank_heads(g.m, g.lay.tp)[0])


def _head_bytes(g: Emitter, tokens: int, heads: int) -> float:
    m = g.m
    return float(g.spec.micro_batch_size * tokens * heads * (m.hidden // m.heads) * g.act_b)


def _gather(g: Emitter, st: Any, s: int, name: str) -> None:
    """The keys and the values all-gathered, each its own collective, then both put in chunk order
    (an index_select each: the gathered tensors read and written)."""
    kv = _kv_bytes(g, g.m.seq_len)
    for part in ("k", "v"):
        st.pending += g.collective(st, f"{name}.cp.{part}.ag", "all_gather", kv, "cp", g.lay.cp_groups(s))
    g.mem(st, f"{name}.cp.kv.order", 2 * 2 * kv, "elementwise")


def _reduce(g: Emitter, st: Any, s: int, name: str) -> None:
    """The gathered keys' and values' gradients summed from the rank's two chunks into zeroed
    whole-sequence buffers and put back in rank order (written, read and written, read and
    written: 6 passes of each), then each reduce-scattered, before the QKV backward needs them."""
    kv = _kv_bytes(g, g.m.seq_len)
    g.mem(st, f"{name}.cp.dkv.sum", 2 * 6 * kv, "elementwise")
    for part in ("k", "v"):
        st.pending += g.collective(st, f"{name}.cp.d{part}.rs", "reduce_scatter", kv, "cp", g.lay.cp_groups(s))


def _heads_split(g: Emitter, st: Any, s: int, name: str, backward: bool) -> None:
    """Ulysses: the rank's tokens of every head all-to-all'd to every token of its 1/cp of the
    heads, the attention over the whole sequence, and back (the module docstring)."""
    m, cp = g.m, g.lay.cp
    local = m.seq_len // cp
    q, kv = _q_bytes(g, local), _kv_bytes(g, local)
    groups = g.lay.cp_groups(s)

    def exchange(parts: tuple[tuple[str, float], ...]) -> None:
        if not g.comm:
            return
        for part, size in parts:
            st.pending += g.collective(st, f"{name}.cp.{part}.a2a", "all_to_all", size, "cp", groups)

    exchange((("do", q),) if backward else (("q", q), ("k", kv), ("v", kv)))
    _attention(g, st, name, m.seq_len, m.seq_len, True, backward, head_split=cp)
    exchange((("dq", q), ("dk", kv), ("dv", kv)) if backward else (("o", q),))


def _ring(g: Emitter, st: Any, s: int, name: str, backward: bool) -> None:
    """Ring attention's cp steps (the module docstring). Each step's exchange runs beside the
    step's attention; the next step waits for it."""
    m, cp = g.m, g.lay.cp
    local = m.seq_len // cp
    kv = 2 * _kv_bytes(g, local)  # the rank's block: its keys and values
    # Bytes the step's attention output (forward) or query gradient (backward) takes.
    out_b = _q_bytes(g, local)
    groups = g.lay.cp_groups(s)
    previous: list[str] = []
    for i in range(cp):
        size = kv * (2 if 0 < i < cp - 1 else 1) if backward else (kv if i < cp - 1 else 0.0)
        # The first exchange follows the rank's last op; each other its group's previous exchange,
        # and backward the previous step's gradients too.
        after = None if i == 0 else [st.last] if backward and st.last else []
        sent = g.collective(st, f"{name}.cp.x{i}", "ring_exchange", size, "cp", groups, after=after,
                            after_each=previous) if size else []
        st.pending += previous
        step = f"{name}.cp{i}"
        if i == 0:
            _attention(g, st, step, local, local, True, backward)
        else:
            _attention(g, st, step, local // 2, local, False, backward, ring_step=True)
        # Forward: the output and its log-sum-exp corrected (read twice, written once); backward:
        # the query gradient and the key/value gradients accumulated (read twice, written once).
        g.mem(st, f"{step}.acc", 3 * (out_b + (kv if backward else 0.0)), "elementwise")
        previous = sent
    st.pending += previous
