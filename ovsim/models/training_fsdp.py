"""FSDP's and DeepSpeed ZeRO-3's per-layer collectives in a training iteration, with the copy
kernels each implementation runs around them (:class:`FsdpCollectives`), emitted beside a stage's
layers by :class:`ovsim.models.training_emit.LayerEmitter`."""

from __future__ import annotations

from ovsim.models.op_specs import FSDP_GATHER_STREAM, FSDP_POST_STREAM
from ovsim.models.training_emit import LayerEmitter, StageState
from ovsim.models.training_spec import layer_params, stage_embedding_params


def postdivide_factor(world_size: int) -> float:
    """What PyTorch's FSDP divides a reduced gradient by after its reduce-scatter: the world size
    over the pre-divide factor, the largest power of 2 that divides the world size and stays at
    most its square root (``_get_gradient_predivide_factor``)."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return world_size / factor


class FsdpCollectives:
    """FSDP / ZeRO-3 per-layer all-gathers (prefetched) and reduce-scatters, with the copy kernels
    the implementation (``parallel.fsdp_impl``) runs around them; docs/training.md, "FSDP's copies".

    PyTorch's FullyShardedDataParallel (``fsdp1``) keeps each unit's parameters in one flat
    parameter whose views the layers use: autograd concatenates the views' gradients into the flat
    gradient (``split_with_sizes``' backward is a ``cat``, on the compute stream), and the
    post-backward hook divides it in place by the pre-divide factor before reduce-scattering it
    (``_reduce_grad``: ``_div_if_needed``, on the post-backward stream; the factor is above 1 for
    every world size above 1). PyTorch's fully_shard (``fsdp2``) gathers into one buffer and copies
    each parameter out of it before the layer runs (``foreach_all_gather_copy_out``), and copies the
    gradients into the reduce-scatter's input (``foreach_reduce``), both on the compute stream, the
    copy-in once the previous unit's reduce-scatter is done (``post_backward`` waits for its event);
    it divides only gradients reduced in FP16, on the reduce-scatter stream (NCCL's average for BF16
    and FP32). DeepSpeed's ZeRO-3 (``zero3``) copies the gathered parameters out of the all-gather's
    buffer on its all-gather stream, copies each gradient into its contiguous reduce bucket on its
    reduce-and-partition stream (``__add_grad_to_ipg_bucket``), and reduce-scatters the bucket, after
    interleaving it by a ``cat`` and dividing it, when the next unit would overflow it
    (``zero3_bucket_elements``, its ``reduce_bucket_size``) and at the end of each backward, on that
    stream: the next copy waits for it. At the end of each backward the compute stream waits for the
    last reduce-scatter (every implementation but ``none``). Each copy or divide reads and writes
    the unit's (or bucket's) unsharded tensor at the wire's width.

    With 16-bit mixed precision PyTorch's FSDPs keep the shards in FP32 and cast them for every
    all-gather (``fsdp1``: ``_use_low_precision_shard`` on the pre-unshard stream; ``fsdp2``:
    ``foreach_all_gather``'s copy-in on the all-gather copy-in stream): 4 + 2 bytes a parameter of
    the shard, on stream ``dp_gather``, the all-gather after it. The reduced shard is cast back to
    FP32 (2 + 4 bytes) and, from the second micro-batch on, added to the gradient accumulated so
    far (4 + 4 + 4), after the reduce-scatter on stream ``dp_post`` (``_cast_grad_to_param_dtype``
    and ``_accumulate_sharded_grad``; ``foreach_reduce``'s post-reduce); ``fsdp1`` (and ``fsdp2`` in
    FP16) first divides it by the post-divide factor where that is above 1 (2 + 2). Left out:
    ``fsdp2``'s copy of the cast shard into the all-gather's input (2 + 2), and its post-reduce
    holding the next reduce-scatter (it runs on that stream); DeepSpeed keeps 16-bit partitions and
    casts once a step.
    """

    def __init__(self, g: LayerEmitter, layers: int) -> None:
        self.g = g
        self.layers = layers
        self.groups = g.lay.dp_groups(0)
        # nccl-tests' size of an all-gather or reduce-scatter is the whole gathered buffer: the
        # layer's unsharded parameters (or gradients), of which each rank holds 1/dp.
        self.layer_bytes = float(layer_params(g.m, g.lay.tp) * g.comm_b)
        # FSDP runs on one pipeline stage (layout refuses pp > 1): it holds the embedding and head.
        self.emb_bytes = float(stage_embedding_params(g.spec, g.m, g.lay.tp, g.lay.pp, 0) * g.comm_b)
        self.names: dict[tuple[str, int, int], list[str]] = {}
        # The last unit's reduce-scatters (fully_shard's next copy-in waits for them).
        self.last_rs: list[str] = []
        # zero3's reduce bucket: its bytes, the copy that last filled it, and how many were reduced.
        self.bucket_cap = float(g.p.zero3_bucket_elements * g.comm_b)
        self.bucket_bytes = 0.0
        self.bucket_copy = ""
        self.buckets = 0
        # PyTorch's FSDPs cast FP32 shards to 16 bits for each gather and back after each reduce.
        self.casts = g.p.fsdp_impl in ("fsdp1", "fsdp2") and g.comm_b == 2
        # The last shard cast back and accumulated (the end of backward waits for it too).
        self.last_post: list[str] = []

    def _copy_out(self, st: StageState, name: str, nbytes: float, gathered: list[str]) -> None:
        """The gathered parameters copied out of the all-gather's buffer once the all-gather
        (``gathered``) is done: fully_shard's on the compute stream; DeepSpeed's on its all-gather
        stream (``AllGatherCoalescedHandle.wait``: each parameter a ``cat`` of its partitions), the
        compute stream waiting for it."""
        impl = self.g.p.fsdp_impl
        if impl == "fsdp2":
            self.g.mem(st, f"{name}.copy_out", 2.0 * nbytes, "elementwise")
        elif impl == "zero3":
            st.pending.append(self.g.side_mem(st, f"{name}.copy_out", 2.0 * nbytes, FSDP_GATHER_STREAM, [],
                                              after_any=gathered))

    def _shard_bytes(self, per_param: float, nbytes: float) -> float:
        """``per_param`` bytes a parameter of the rank's shard of a unit whose gathered tensor is
        ``nbytes`` at the wire's width."""
        return per_param * nbytes / self.g.comm_b / self.g.lay.dp

    def _shard_cast(self, st: StageState, name: str, nbytes: float) -> list[str] | None:
        """The FP32 shard cast to 16 bits before its all-gather (the all-gather's ``after``); None
        where no cast runs."""
        if not self.casts:
            return None
        cast = self.g.side_mem(st, f"{name}.shard_cast", self._shard_bytes(6.0, nbytes), FSDP_GATHER_STREAM,
                               [st.last] if st.last else [])
        return [cast]

    def _post_reduce(self, st: StageState, name: str, nbytes: float, mb: int) -> None:
        """The reduced shard divided by what the pre-divide left (where it divides), cast back to
        FP32 and, after the first micro-batch, accumulated."""
        if not self.casts:
            return
        divides = self.g.p.fsdp_impl == "fsdp1" or self.g.spec.precision == "fp16"
        per_param = (4.0 if divides and postdivide_factor(self.g.lay.dp) > 1 else 0.0) + 6.0 + (12.0 if mb > 0 else 0.0)
        self.last_post = [self.g.side_mem(st, f"{name}.shard_grad", self._shard_bytes(per_param, nbytes),
                                          FSDP_POST_STREAM, [], after_any=self.last_rs)]

    def _reduce(self, st: StageState, name: str, nbytes: float, mb: int = 0) -> None:
        """A unit's gradients reduce-scattered after its backward, with the implementation's copies."""
        impl, g = self.g.p.fsdp_impl, self.g
        after: list[str] | None = None
        if impl == "fsdp1":
            cat = g.mem(st, f"{name}.grad_cat", 2.0 * nbytes, "elementwise")
            after = [g.side_mem(st, f"{name}.predivide", 2.0 * nbytes, FSDP_POST_STREAM, [cat])]
        elif impl == "fsdp2":
            st.pending += self.last_rs
            after = [g.mem(st, f"{name}.copy_in", 2.0 * nbytes, "elementwise")]
            if g.spec.precision == "fp16":
                after = [g.side_mem(st, f"{name}.predivide", 2.0 * nbytes, FSDP_POST_STREAM, after)]
        elif impl == "zero3":
            self._fill_bucket(st, name, nbytes)
            return
        self.last_rs = g.collective(st, f"{name}.rs", "reduce_scatter", nbytes, "dp", self.groups, after=after)
        st.rs += self.last_rs
        self._post_reduce(st, name, nbytes, mb)

    def _fill_bucket(self, st: StageState, name: str, nbytes: float) -> None:
        """zero3: a unit's gradients copied into the reduce bucket, the bucket reduce-scattered first
        where they would overflow it; a copy after a reduce-scatter waits for it."""
        if self.bucket_bytes and self.bucket_bytes + nbytes > self.bucket_cap:
            self._flush(st)
        self.bucket_copy = self.g.side_mem(st, f"{name}.copy_in", 2.0 * nbytes, FSDP_POST_STREAM,
                                           [st.last] if st.last else [], after_any=self.last_rs)
        self.last_rs = []
        self.bucket_bytes += nbytes

    def _flush(self, st: StageState) -> None:
        """zero3: the bucket reduce-scattered (``reduce_scatter_coalesced``: its tensors' partitions
        interleaved by a ``cat`` and divided by the world size first, both passes over the bucket)."""
        g, name, nbytes = self.g, f"fsdp.bucket{self.buckets}", self.bucket_bytes
        cat = g.side_mem(st, f"{name}.cat", 2.0 * nbytes, FSDP_POST_STREAM, [self.bucket_copy])
        div = g.side_mem(st, f"{name}.predivide", 2.0 * nbytes, FSDP_POST_STREAM, [cat])
        self.last_rs = g.collective(st, f"{name}.rs", "reduce_scatter", nbytes, "dp", self.groups, after=[div])
        st.rs += self.last_rs
        self.buckets += 1
        self.bucket_bytes = 0.0

    def end_backward(self, st: StageState) -> None:
        """The end of a micro-batch's backward: zero3 reduce-scatters what its bucket holds
        (``independent_gradient_partition_epilogue``), and the compute stream waits for the last
        reduce-scatter before going on (DeepSpeed synchronizes its reduce stream there, fully_shard
        and FullyShardedDataParallel wait for it in their final backward callbacks)."""
        if self.g.p.fsdp_impl == "none":
            return
        if self.bucket_bytes:
            self._flush(st)
        st.pending += self.last_rs + self.last_post

    def _gather(self, st: StageState, phase: str, layer: int, mb: int) -> None:
        key = (phase, layer, mb)
        if key in self.names or not 0 <= layer < self.layers:
            return
        name = f"{phase}{mb}.L{layer}.fsdp"
        after = self._shard_cast(st, name, self.layer_bytes)
        self.names[key] = self.g.collective(st, f"{name}.ag", "all_gather", self.layer_bytes, "dp", self.groups,
                                            after=after)

    def gather_embedding(self, st: StageState) -> None:
        if ("E", -1, 0) in self.names:
            return
        after = self._shard_cast(st, "fsdp.embed", self.emb_bytes)
        self.names[("E", -1, 0)] = self.g.collective(st, "fsdp.embed.ag", "all_gather", self.emb_bytes, "dp",
                                                     self.groups, after=after)
        st.pending += self.names[("E", -1, 0)]
        self._copy_out(st, "fsdp.embed", self.emb_bytes, self.names[("E", -1, 0)])

    def _ahead(self) -> range:
        # Prefetching more layers than the model has is prefetching all of them.
        return range(min(self.g.p.fsdp_prefetch, self.g.m.layers) + 1)

    def before_forward(self, st: StageState, layer: int, mb: int) -> None:
        for ahead in self._ahead():
            self._gather(st, "F", layer + ahead, mb)
        st.pending += self.names[("F", layer, mb)]
        self._copy_out(st, f"F{mb}.L{layer}.fsdp", self.layer_bytes, self.names[("F", layer, mb)])

    def before_backward(self, st: StageState, layer: int, mb: int) -> None:
        for ahead in self._ahead():
            self._gather(st, "B", layer - ahead, mb)
        st.pending += self.names[("B", layer, mb)]
        self._copy_out(st, f"B{mb}.L{layer}.fsdp", self.layer_bytes, self.names[("B", layer, mb)])

    def after_backward(self, st: StageState, layer: int, mb: int) -> None:
        self._reduce(st, f"B{mb}.L{layer}.fsdp", self.layer_bytes, mb)

    def reduce_embedding(self, st: StageState, mb: int) -> None:
        self._reduce(st, f"B{mb}.fsdp.embed", self.emb_bytes, mb)
