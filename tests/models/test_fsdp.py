"""FSDP in a training iteration: its per-layer collectives and the copy kernels each implementation
(PyTorch's FullyShardedDataParallel and fully_shard, DeepSpeed's ZeRO-3) runs around them.

Golden byte counts come from GPT-3 XL's closed-form layer size, never from the generator itself.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from training_cases import SMALL
from training_cases import predict_training as _predict

from ovsim.api import predict
from ovsim.errors import OvsimError
from ovsim.models.training import training_ops
from ovsim.models.training_spec import PRESETS, TrainingSpec, layer_params
from ovsim.models.workload import CollectiveOpSpec
from ovsim.scenario import Scenario


def test_overlap_grad_reduce_off_is_refused_with_fsdp() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "parallel": {"dp_mode": "fsdp", "overlap_grad_reduce": False}})
    with pytest.raises(OvsimError, match="overlap_grad_reduce is DDP's") as e:
        training_ops(spec, 4)
    assert e.value.field == "parallel.overlap_grad_reduce"


def test_fsdp_gathers_every_layer_twice_and_reduce_scatters_once_per_micro_batch() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 2, "parallel": {"dp_mode": "fsdp"}})
    ops = training_ops(spec, 4).ops
    kinds = pd.Series([o.kind for o in ops if isinstance(o, CollectiveOpSpec)]).value_counts()
    layers = SMALL["layers"]
    assert kinds["all_gather"] == 2 * 2 * layers + 1  # + the embedding, gathered once
    assert kinds["reduce_scatter"] == 2 * (layers + 1)


@pytest.mark.parametrize("managed", [True, False])
def test_overlapped_fsdp_beats_sequential_and_hides_most_communication(managed: bool) -> None:
    fsdp = {**SMALL, "parallel": {"dp_mode": "fsdp"}}
    over = _predict(fsdp, power_managed=managed).summary()
    seq = _predict(fsdp, schedule="sequential", power_managed=managed).summary()
    assert seq["makespan_s"] > over["makespan_s"]
    assert seq["exposed_comm_s"] == pytest.approx(seq["comm_s"], rel=1e-6)
    # Under the 400 W loop the A100's GEMMs run at the top clock, faster than the calibrated rate
    # of a GEMM repeated at the limit, so a little less communication fits under them.
    assert over["comm_hidden_fraction"] > (0.45 if managed else 0.5)


def test_fsdp_collectives_of_one_process_group_never_run_at_once() -> None:
    # NCCL runs one communicator's collectives one at a time in issue order (NVIDIA/nccl#574), so
    # a reduce-scatter never holds SMs beside an all-gather of the same group.
    ops = _predict({**SMALL, "micro_batches": 2, "parallel": {"dp_mode": "fsdp"}}).ops
    coll = ops[ops["kind"] == "collective"]
    assert coll["name"].str.endswith(".fsdp.rs").any() and coll["name"].str.endswith(".fsdp.ag").any()
    for _, rank in coll.groupby("rank"):
        rank = rank.sort_values("start_s")
        starts, ends = rank["start_s"].to_numpy(), rank["end_s"].to_numpy()
        assert (starts[1:] >= ends[:-1] - 1e-12).all()


def test_fsdp_collectives_move_the_layer_once_gathered() -> None:
    """An FSDP all-gather assembles one layer's unsharded parameters from dp shards, and the
    reduce-scatter leaves each rank 1/dp of its gradients: nccl-tests' size (the whole gathered
    buffer, NVIDIA/nccl-tests doc/PERFORMANCE.md) is the layer's bytes, whatever dp is."""
    for dp in (2, 4):
        spec = TrainingSpec.model_validate({**SMALL, "embedding_and_head": False, "parallel": {"dp_mode": "fsdp"}})
        layer_bytes = layer_params(spec.shape(), 1) * 2  # BF16 parameters and gradients
        colls = [o for o in training_ops(spec, dp).ops if isinstance(o, CollectiveOpSpec)]
        assert colls and {o.size_bytes for o in colls} == {layer_bytes}


def _fsdp_ops(impl: str, precision: str = "bf16", micro_batches: int = 2, **parallel: Any) -> list[Any]:
    spec = TrainingSpec.model_validate({**SMALL, "embedding_and_head": False, "precision": precision,
                                        "micro_batches": micro_batches,
                                        "parallel": {"dp_mode": "fsdp", "fsdp_impl": impl, **parallel}})
    return list(training_ops(spec, 4).ops)


# GPT-3 XL's layer holds 12 h^2 + 13 h parameters (the weights and biases of QKV, the projection and
# the two MLP matrices, and two layer norms); in BF16, 2 bytes each. Every FSDP copy or divide
# reads and writes a layer's unsharded tensor once: twice that.
_H = PRESETS["gpt3-1.3b"].hidden
LAYER_PARAMS = 12 * _H * _H + 13 * _H
LAYER_COPY_BYTES = 2 * 2 * LAYER_PARAMS


def _compute_order(ops: list[Any]) -> list[str]:
    return [o.name for o in ops if o.stream == "compute"]


def test_fsdp1_concatenates_and_predivides_each_layers_gradients_before_its_reduce_scatter() -> None:
    """PyTorch's FullyShardedDataParallel: autograd concatenates a layer's parameter gradients into
    its flat gradient (split_with_sizes' backward is a cat) on the compute stream, right after the
    layer's backward, and ``_reduce_grad`` divides it in place by the pre-divide factor on the
    post-backward stream before reduce-scattering it."""
    ops = _fsdp_ops("fsdp1")
    by_name = {o.name: o for o in ops}
    cats = [o for o in ops if o.name.endswith(".grad_cat")]
    divs = [o for o in ops if o.name.endswith(".predivide")]
    assert len(cats) == len(divs) == 2 * SMALL["layers"]
    assert {o.bytes for o in cats + divs} == {LAYER_COPY_BYTES}
    assert {o.stream for o in cats} == {"compute"} and {o.stream for o in divs} == {"dp_post"}
    order = _compute_order(ops)
    for cat in cats:
        unit = cat.name.removesuffix(".fsdp.grad_cat")  # B{mb}.L{layer}
        assert order[order.index(cat.name) - 1] == f"{unit}.norm1.bwd"  # the layer's last backward op
    for rs in (o for o in ops if isinstance(o, CollectiveOpSpec) and o.kind == "reduce_scatter"):
        unit = rs.name.removesuffix(".rs")
        assert rs.after == [f"{unit}.predivide"] and by_name[f"{unit}.predivide"].after == [f"{unit}.grad_cat"]
    assert not any(o.name.endswith((".copy_out", ".copy_in")) for o in ops)


@pytest.mark.parametrize(("precision", "divides"), [("bf16", False), ("fp16", True)])
def test_fsdp2_copies_gathered_parameters_out_and_gradients_in(precision: str, divides: bool) -> None:
    """PyTorch's fully_shard: each all-gather's output is copied out into the parameters on the
    compute stream once the all-gather is done, and each unit's gradients are copied into the
    reduce-scatter's input on the compute stream once the previous unit's reduce-scatter is done
    (``post_backward`` waits for its event); only FP16 gradients are then divided, on the
    reduce-scatter stream (BF16 and FP32 use NCCL's average)."""
    ops = _fsdp_ops("fsdp2", precision)
    layers, mbs = SMALL["layers"], 2
    gathers = {o.name for o in ops if isinstance(o, CollectiveOpSpec) and o.kind == "all_gather"}
    outs = [o for o in ops if o.name.endswith(".copy_out")]
    assert len(outs) == len(gathers) == 2 * mbs * layers
    assert {o.stream for o in outs} == {"compute"} and {o.bytes for o in outs} == {LAYER_COPY_BYTES}
    for o in outs:
        assert o.name.replace(".copy_out", ".ag") in o.after_any
    ins = [o for o in ops if o.name.endswith(".copy_in")]
    assert len(ins) == mbs * layers and {o.stream for o in ins} == {"compute"}
    rs = [o.name for o in ops if isinstance(o, CollectiveOpSpec) and o.kind == "reduce_scatter"]
    assert [o.after_any for o in ins] == [[]] + [[r] for r in rs[:-1]]
    divs = [o for o in ops if o.name.endswith(".predivide")]
    assert len(divs) == (mbs * layers if divides else 0) and {o.stream for o in divs} <= {"dp_post"}
    assert not any(o.name.endswith(".grad_cat") for o in ops)


def test_zero3_copies_gradients_into_its_bucket_and_reduces_it_when_full() -> None:
    """DeepSpeed's ZeRO-3: each gathered layer is copied out of the all-gather's buffer on the
    all-gather stream, and the compute waits for the copy; each gradient is copied into the
    contiguous reduce bucket on the reduce-and-partition stream after the backward that made it;
    the bucket is reduce-scattered when the next layer would overflow it and at the end of each
    backward (8 layers in buckets of 3: 3, 3 and 2 layers), after a cat that interleaves it and a
    divide, on that stream, so the next copy waits for the reduce-scatter."""
    ops = _fsdp_ops("zero3", zero3_bucket_elements=3 * LAYER_PARAMS)
    by_name = {o.name: o for o in ops}
    outs = [o for o in ops if o.name.endswith(".copy_out")]
    assert len(outs) == 2 * 2 * SMALL["layers"] and {o.stream for o in outs} == {"dp_gather"}
    for o in outs:
        assert o.after_any == [o.name.replace(".copy_out", ".ag")]
        layer_first = next(x for x in ops[ops.index(o):] if x.stream == "compute")
        assert o.name in layer_first.after_any
    ins = [o for o in ops if o.name.endswith(".copy_in")]
    assert len(ins) == 2 * SMALL["layers"] and {o.stream for o in ins} == {"dp_post"}
    assert {o.bytes for o in ins + outs} == {LAYER_COPY_BYTES}
    for o in ins:
        assert o.after == [o.name.replace(".fsdp.copy_in", ".norm1.bwd")]
    rs = [o for o in ops if isinstance(o, CollectiveOpSpec) and o.kind == "reduce_scatter"]
    layer_bytes = 2 * LAYER_PARAMS
    assert [o.size_bytes for o in rs] == [3 * layer_bytes, 3 * layer_bytes, 2 * layer_bytes] * 2
    flushed_before = {}
    for o in rs:
        bucket = o.name.removesuffix(".rs")
        div, cat = by_name[f"{bucket}.predivide"], by_name[f"{bucket}.cat"]
        assert o.after == [div.name] and div.after == [cat.name]
        assert div.bytes == cat.bytes == 2 * o.size_bytes and {div.stream, cat.stream} == {"dp_post"}
        (copy,) = cat.after
        following = ins[ins.index(by_name[copy]) + 1:]
        if following:
            flushed_before[following[0].name] = [o.name]
    assert [o.after_any for o in ins] == [flushed_before.get(o.name, []) for o in ins]


@pytest.mark.parametrize("impl", ["fsdp1", "fsdp2", "zero3"])
def test_the_next_micro_batch_waits_for_the_last_reduce_scatter(impl: str) -> None:
    """At the end of a backward the compute stream waits for its last reduce-scatter: DeepSpeed
    synchronizes its reduce stream in its epilogue, PyTorch's FSDPs wait for it in their final
    backward callbacks."""
    ops = _fsdp_ops(impl)
    rs = [o.name for o in ops if isinstance(o, CollectiveOpSpec) and o.kind == "reduce_scatter"]
    first_of_mb1 = next(o for o in ops if o.stream == "compute" and o.name.startswith("F1."))
    last_of_mb0 = [r for r in rs if ops.index(next(o for o in ops if o.name == r)) < ops.index(first_of_mb1)][-1]
    assert last_of_mb0 in first_of_mb1.after_any


@pytest.mark.parametrize(("impl", "copies_per_layer"), [("none", 0), ("fsdp1", 2), ("fsdp2", 3), ("zero3", 5)])
def test_fsdp_copies_cost_what_their_bytes_take(impl: str, copies_per_layer: int) -> None:
    """With nothing overlapping the copies (sequential schedule, analytic, no power loop), each
    implementation's iteration exceeds the copy-free one by exactly its copies' time, and that time
    is their bytes (fsdp1: the cat and the pre-divide a layer; fsdp2: two copy-outs, forward and
    backward, and the copy-in; zero3, its bucket a layer: the two copy-outs, the copy-in and the
    bucket's cat and divide; PyTorch's two, their shard casts) over a streaming kernel's bandwidth: at most the
    A100 40 GB's HBM peak (1,555 GB/s, its datasheet), at least half of it."""
    copy = (".grad_cat", ".predivide", ".copy_out", ".copy_in", ".cat", ".shard_cast", ".shard_grad")
    base = {**SMALL, "embedding_and_head": False, "optimizer": False}
    times = {}
    for each in ("none", impl):
        # ZeRO-3's bucket of one layer: a reduce-scatter a layer, as the others.
        parallel = {"dp_mode": "fsdp", "fsdp_impl": each, "zero3_bucket_elements": LAYER_PARAMS}
        r = _predict({**base, "parallel": parallel}, schedule="sequential", mode="analytic", power_managed=False)
        times[each] = r.timeline.makespan_s
        copies_s = float(r.ops.loc[r.ops["name"].str.endswith(copy), "duration_s"].sum())
    copy_bytes = copies_per_layer * SMALL["layers"] * LAYER_COPY_BYTES
    if impl in ("fsdp1", "fsdp2"):
        # The FP32 shard cast for the forward's and the backward's gathers (4 + 2 B each) and the
        # reduced shard cast back (2 + 4 B), a quarter of the layer on 4 ranks; fsdp1 first divides
        # it by the post-divide factor, 2 on 4 ranks (2 + 2 B).
        copy_bytes += SMALL["layers"] * (3 * 6 + (4 if impl == "fsdp1" else 0)) * LAYER_PARAMS / 4
    assert times[impl] - times["none"] == pytest.approx(copies_s, rel=1e-6, abs=1e-12)
    assert copy_bytes / 1.555e12 <= copies_s <= 2 * copy_bytes / 1.555e12


@pytest.mark.parametrize("impl", ["fsdp1", "fsdp2", "zero3", "none"])
def test_stream_priorities_need_not_name_fsdps_own_stream(impl: str) -> None:
    """A scenario's priorities name the streams it knows (compute, tp, dp); FSDP's post-backward
    stream is the framework's own, and a priority for a stream this layout leaves unused (tp) is
    no typo beside it."""
    sc = Scenario.model_validate({"name": "t", "system": "a100x4", "mode": "analytic",
                                  "streams": {"compute": 0, "dp": -1, "tp": -1},
                                  "training": {**SMALL, "layers": 2,
                                               "parallel": {"dp_mode": "fsdp", "fsdp_impl": impl}}})
    assert predict(sc).timeline.makespan_s > 0


@pytest.mark.parametrize(("impl", "precision"), [("fsdp1", "bf16"), ("fsdp2", "bf16"), ("fsdp1", "fp16"),
                                                  ("fsdp2", "fp8")])
def test_pytorch_fsdp_casts_its_fp32_shards_for_each_gather_and_after_each_reduce(impl: str, precision: str) -> None:
    """16-bit mixed precision on 4 ranks: before each all-gather the rank's FP32 shard, a quarter of
    the layer, is cast to 16 bits (4 + 2 B a parameter) on the gather stream, the all-gather after
    it; after each reduce-scatter the reduced shard is cast back (2 + 4 B) and, from the second
    micro-batch, added to the accumulated gradient (4 + 4 + 4 B), on the post-backward stream, and
    the next micro-batch waits for it. fsdp1 divides the reduced shard first by the post-divide
    factor, 4 / 2 on 4 ranks (PyTorch's _get_gradient_predivide_factor: 2) (2 + 2 B); fsdp2 only in
    FP16. FP32 training and DeepSpeed cast nothing."""
    ops = _fsdp_ops(impl, precision=precision, micro_batches=2)
    divide = 4 if impl == "fsdp1" else 0
    by_name = {o.name: o for o in ops}
    casts = [o for o in ops if o.name.endswith(".shard_cast") and ".L" in o.name]
    assert len(casts) == 2 * 2 * SMALL["layers"] and {o.stream for o in casts} == {"dp_gather"}
    assert [o.bytes for o in casts] == pytest.approx([6 * LAYER_PARAMS / 4] * len(casts))
    for c in casts:
        assert by_name[c.name.replace(".shard_cast", ".ag")].after == [c.name]
    post = {o.name: o for o in ops if o.name.endswith(".shard_grad") and ".L" in o.name}
    assert {o.stream for o in post.values()} == {"dp_post"}
    assert post["B0.L3.fsdp.shard_grad"].bytes == pytest.approx((divide + 6) * LAYER_PARAMS / 4)
    assert post["B1.L3.fsdp.shard_grad"].bytes == pytest.approx((divide + 18) * LAYER_PARAMS / 4)
    assert post["B0.L3.fsdp.shard_grad"].after_any == ["B0.L3.fsdp.rs"]
    first_of_mb1 = next(o for o in ops if o.name.startswith("F1.") and o.stream == "compute")
    last_post_mb0 = [n for n in post if n.startswith("B0.")][-1]
    assert last_post_mb0 in first_of_mb1.after_any
    for kw in ({"precision": "fp32"}, {}):
        other = _fsdp_ops(impl if kw else "zero3", **kw)
        assert not [o for o in other if o.name.endswith((".shard_cast", ".shard_grad"))]


def test_the_embedding_s_shard_is_cast_before_its_one_gather() -> None:
    """The embedding (tied, with learned positions) is gathered once an iteration and reduced every
    micro-batch: its FP32 shard cast once, 6 B a parameter of its quarter on 4 ranks, before the
    gather, which waits for it."""
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 2, "parallel": {"dp_mode": "fsdp"}})
    ops = {o.name: o for o in training_ops(spec, 4).ops}
    embedding = (PRESETS["gpt3-1.3b"].vocab + SMALL["seq_len"]) * _H
    assert ops["fsdp.embed.shard_cast"].bytes == pytest.approx(6 * embedding / 4)
    assert ops["fsdp.embed.ag"].after == ["fsdp.embed.shard_cast"]
    assert {n for n in ops if n.endswith("fsdp.embed.shard_grad")} == {"B0.fsdp.embed.shard_grad",
                                                                      "B1.fsdp.embed.shard_grad"}


def test_the_post_divide_factor_is_pytorchs() -> None:
    """FSDP's pre-divide factor is the largest power of 2 dividing the world size at most its square
    root; what is left is divided after the reduce-scatter (torch/distributed/fsdp/_init_utils)."""
    from ovsim.models.training_fsdp import postdivide_factor

    assert [postdivide_factor(n) for n in (1, 2, 4, 8, 16, 32, 6)] == [1, 1, 2, 2, 4, 4, 1.5]
