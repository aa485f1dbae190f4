"""Training-iteration generator: shapes, parallel layouts, schedules and their checks.

Golden numbers here come from closed forms named in each test (GPT-3 / LLaMA parameter counts,
pipeline bubble fractions from GPipe and Megatron-LM), never from the generator itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from training_cases import SMALL
from training_cases import predict_training as _predict

from ovsim.api import build, predict
from ovsim.errors import OvsimError
from ovsim.models.pipeline import exchange_steps, stage_order
from ovsim.models.training import training_ops
from ovsim.models.training_spec import PRESETS, TrainingSpec, chunk_layers, layer_params
from ovsim.models.workload import CollectiveOpSpec, GemmOp, SendRecvOp
from ovsim.scenario import Scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("name", "billions"), [
    # Published sizes: GPT-3 table 2.1, Llama 2 table 1, Llama 3 (arXiv 2407.21783) table 3.
    ("gpt3-1.3b", 1.3), ("gpt3-2.7b", 2.7), ("gpt3-6.7b", 6.7), ("gpt3-13b", 13.0), ("gpt3-175b", 175.0),
    ("llama2-7b", 7.0), ("llama2-13b", 13.0), ("llama2-70b", 70.0),
    ("llama3-8b", 8.0), ("llama3-70b", 70.0), ("llama3-405b", 405.0),
])
def test_preset_parameter_counts_match_the_published_sizes(name: str, billions: float) -> None:
    m = PRESETS[name]
    emb = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
    total = m.layers * layer_params(m, 1) + emb
    assert total / 1e9 == pytest.approx(billions, rel=0.05)


def test_forward_and_backward_gemm_flops_are_six_times_params_times_tokens() -> None:
    """The dense GEMMs of one iteration do 6 x (layer matrix parameters) x tokens FLOPs
    (Kaplan et al. 2020; Narayanan et al. SC'21), plus 8 x for the recomputed forward."""
    spec = TrainingSpec.model_validate({**SMALL, "embedding_and_head": False, "optimizer": False})
    m = spec.shape()
    tokens = spec.micro_batch_size * m.seq_len
    weights = sum(i * o for i, o in {"qkv": (m.hidden, 3 * m.hidden), "proj": (m.hidden, m.hidden),
                                     "fc1": (m.hidden, 4 * m.hidden), "fc2": (4 * m.hidden, m.hidden)}.values())
    for recompute, factor in ((False, 6), (True, 8)):
        ops = training_ops(spec.model_copy(update={"recompute": recompute}), 1).ops
        flops = sum(2 * o.m * o.n * o.k for o in ops if isinstance(o, GemmOp))
        assert flops == factor * weights * m.layers * tokens


@pytest.mark.parametrize("tp", [1, 2])
def test_unfused_attention_does_the_papers_gemm_flops(tp: int) -> None:
    """Narayanan et al. (SC'21), section 5.1: a layer's forward does 24 b s h^2 + 4 b s^2 h FLOPs of
    GEMMs, the second term the unfused attention's QK^T and PV over the whole s x s; backward
    twice the forward. Per tensor-parallel rank, a t-th of it."""
    spec = TrainingSpec.model_validate({**SMALL, "embedding_and_head": False, "optimizer": False,
                                        "attention": "unfused", "parallel": {"tp": tp}})
    m = spec.shape()
    b, s, h = spec.micro_batch_size, m.seq_len, m.hidden
    ops = [o for o in training_ops(spec, tp).ops if isinstance(o, GemmOp) and 0 in o.ranks]
    flops = sum(2 * o.m * o.n * o.k for o in ops)
    assert flops == 3 * m.layers * (24 * b * s * h * h + 4 * b * s * s * h) // tp
    assert not any(o.kind == "attention" for o in training_ops(spec, tp).ops)


def test_an_iteration_does_the_flops_megatron_lm_counts() -> None:
    """Narayanan et al. (SC'21), equation 3, an iteration's FLOPs with full recomputation and
    unfused attention: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)); their table 1's 18B row
    (h 6144, 48 heads, 40 layers, vocabulary 51,200, sequence 2048, TP 8 on 256 GPUs, batch 1024 of
    micro-batches of 8). ovsim's GEMMs and attention on one data-parallel replica, times the
    replicas, must do exactly that."""
    B, s, l_, h, V = 1024, 2048, 40, 6144, 51200
    sc = Scenario.model_validate({
        "schema": "ovsim.scenario/1", "name": "megatron-18b", "system": "dgx-a100-hdr", "nodes": 32,
        "training": {"model": {"layers": l_, "hidden": h, "heads": 48, "vocab": V, "seq_len": s,
                               "gated_mlp": False, "tied_embeddings": True},
                     "micro_batch_size": 8, "micro_batches": 4, "precision": "fp16", "recompute": True,
                     "attention": "unfused", "parallel": {"tp": 8, "dp": 32}}})
    wl = build(sc)[0]
    flops = sum(op.kernel.flops for op in wl.ops if op.kernel is not None and op.flow is None)
    assert wl.n_ranks * wl.replicas == 256
    per_gpu = flops / wl.n_ranks
    assert per_gpu * 256 == pytest.approx(96 * B * s * l_ * h * h * (1 + s / (6 * h) + V / (16 * l_ * h)), rel=1e-12)


KORTHIKANTI_22B: dict[str, Any] = {
    "model": {"layers": 48, "hidden": 6144, "heads": 64, "vocab": 51200, "seq_len": 2048, "gated_mlp": False,
              "tied_embeddings": True},
    "micro_batch_size": 4, "precision": "fp16", "attention": "unfused", "parallel": {"tp": 8}}


def test_selective_recomputation_does_the_papers_hardware_flops() -> None:
    """Korthikanti et al. (arXiv 2205.05198), appendix A: an iteration's model FLOPs are
    72 B L s h^2 (1 + s/(6h) + V/(12 h L)) (equation 7), and selective recomputation adds "an
    additional forward pass attention matrix computation (2Bs^2h operations) and attention over
    values (2Bs^2h operations)" a layer; on their table 3's 22B model (TP 8, batch 4). ovsim's GEMMs
    on the eight ranks must do exactly that. (The paper's equation 8 writes the sum as s/(3h) in
    place of s/(6h), 8 B L s^2 h more than the operations its text lists.)"""
    B, L, s, h, V = 4, 48, 2048, 6144, 51200
    spec = TrainingSpec.model_validate({**KORTHIKANTI_22B, "recompute": "selective"})
    ops = [o for o in training_ops(spec, 8).ops if isinstance(o, GemmOp)]
    per_rank = sum(2 * o.m * o.n * o.k for o in ops)
    model_flops = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert per_rank * 8 == pytest.approx(model_flops + L * 4 * B * s * s * h, rel=1e-12)


def test_selective_recomputation_reruns_the_core_attention_where_autograd_reaches_it() -> None:
    """Megatron-LM's selective recomputation checkpoints the core attention alone: in each layer's
    backward its forward (QK^T, softmax, dropout, PV) runs again after the projection's gradients
    and before the attention's own backward; nothing else of the forward runs twice."""
    spec = TrainingSpec.model_validate({**KORTHIKANTI_22B, "layers": 2, "recompute": "selective"})
    names = [o.name for o in training_ops(spec, 8).ops if o.stream == "compute"]
    again = [n for n in names if n.startswith("R")]
    assert again == [f"R0.L{layer}.attn.{part}" for layer in (1, 0) for part in ("qk", "softmax", "dropout", "pv")]
    for layer in (0, 1):
        first, last = names.index(f"R0.L{layer}.attn.qk"), names.index(f"R0.L{layer}.attn.pv")
        assert names.index(f"B0.L{layer}.proj.wgrad") < first
        assert last < names.index(f"B0.L{layer}.attn.bwd.pv.dgrad")
    assert spec.recompute_mode == "selective"
    for value, mode in ((True, "full"), ("full", "full"), (False, "none"), ("none", "none")):
        assert spec.model_copy(update={"recompute": value}).recompute_mode == mode


def test_fp8_quantizes_each_linears_input_and_output_gradient() -> None:
    """Transformer Engine's FP8 linears quantize their 16-bit input in forward and their output
    gradient in backward, each into a row-wise and a transposed FP8 copy (2 bytes read, 2 written
    an element; TE's fp8_cast_transpose_fused and fp8_cast_transpose_bgrad_fused), FC1's gradient
    inside the activation's backward. Llama 2 70B with TP 4, per rank and layer (Touvron et al.,
    table 1 and config.json: h 8192, FFN 28672, 64 heads, 8 key/value heads): inputs h, h/4, h and
    28672/4 wide; output gradients (h + 2h/8)/4, h and h wide."""
    h, f, t, tokens = 8192, 28672, 4, 4096
    spec = TrainingSpec.model_validate({"model": "llama2-70b", "layers": 2, "precision": "fp8",
                                        "embedding_and_head": False, "optimizer": False, "parallel": {"tp": t}})
    ops = [o for o in training_ops(spec, t).ops if o.name.endswith(".fp8") and 0 in o.ranks]
    forward = sum(o.bytes for o in ops if o.name.startswith("F0.L0."))  # type: ignore[attr-defined]
    backward = sum(o.bytes for o in ops if o.name.startswith("B0.L0."))  # type: ignore[attr-defined]
    assert forward == 4 * tokens * (h + h // t + h + f // t)
    assert backward == 4 * tokens * ((h + 2 * h // 8) // t + h + h)
    bf16 = spec.model_copy(update={"precision": "bf16"})
    assert not any(o.name.endswith(".fp8") for o in training_ops(bf16, t).ops)
    # With sequence parallelism TE casts the QKV and FC1 inputs on its 1/t of the tokens before the
    # FP8 all-gather (2 bytes read, 1 written) and transposes the gathered FP8 tensor (1 + 1).
    sp = spec.model_copy(update={"parallel": spec.parallel.model_copy(update={"sequence_parallel": True})})
    ops = [o for o in training_ops(sp, t).ops if o.name.endswith(".fp8") and 0 in o.ranks]
    forward = sum(o.bytes for o in ops if o.name.startswith("F0.L0."))  # type: ignore[attr-defined]
    assert forward == 2 * (3 * tokens // t * h + 2 * tokens * h) + 4 * tokens * (h // t + f // t)
    # ... and gathers them in FP8: a byte an element of the whole gathered input.
    gathers = {o.name: o.size_bytes for o in training_ops(sp, t).ops
               if isinstance(o, CollectiveOpSpec) and o.name.startswith("F0.L0.") and o.kind == "all_gather"}
    assert gathers == {"F0.L0.qkv.ag": tokens * h, "F0.L0.fc1.ag": tokens * h}


def test_fp8_backward_gathers_are_fp8() -> None:
    """Transformer Engine gathers in FP8 in the backward too: the row-parallel linears' output
    gradients cast first "for efficient gather" (grad_output_preprocess), the column-parallel
    ones' saved FP8 transposed inputs again for their weight gradients (gather_along_last_dim),
    and its overlapped TP communication's all-gather buffers are FP8 under an FP8 recipe
    (initialize_ub). The four gathers a layer move a byte an element of the whole tokens x h,
    with or without the overlap; in BF16, two."""
    h, t, tokens = 8192, 4, 4096
    for precision, overlap, width in (("fp8", "chunked", 1), ("fp8", "none", 1), ("bf16", "none", 2)):
        spec = TrainingSpec.model_validate({"model": "llama2-70b", "layers": 2, "precision": precision,
                                            "embedding_and_head": False, "optimizer": False,
                                            "parallel": {"tp": t, "sequence_parallel": True, "tp_overlap": overlap,
                                                         "tp_chunks": 1}})
        gathered = sum(o.size_bytes for o in training_ops(spec, t).ops if isinstance(o, CollectiveOpSpec)
                       and o.name.startswith("B0.L0.") and o.kind == "all_gather")
        assert gathered == 4 * width * tokens * h, (precision, overlap)


def test_sequence_parallel_embedding_and_head_communicate_as_megatron_lm() -> None:
    """Megatron-LM with sequence parallelism: the word embeddings are reduce-scattered into the
    sequence-parallel region without learned positions (Llama), all-reduced with them (GPT-3, its
    positions added after), and the backward of either scatter is an all-gather; the LM head, a
    column-parallel linear, gathers its input again for its weight gradient and reduce-scatters
    its data gradient beside that GEMM."""
    for model, forward in (("llama2-7b", "reduce_scatter"), ("gpt3-1.3b", "all_reduce")):
        spec = TrainingSpec.model_validate({"model": model, "layers": 2,
                                            "parallel": {"tp": 2, "sequence_parallel": True}})
        ops = training_ops(spec, 2).ops
        comm = {o.name: o for o in ops if isinstance(o, CollectiveOpSpec) and o.stream == "tp"}
        assert comm[f"F0.embed.{forward}"].kind == forward
        assert comm["B0.embed.bwd.all_gather"].kind == "all_gather"
        head_ag, head_rs = comm["B0.head.wgrad.ag"], comm["B0.head.reduce_scatter"]
        wgrad = next(o for o in ops if o.name == "B0.head.wgrad")
        assert head_ag.name in wgrad.after_any and head_rs.after == ["B0.head.dgrad"]
        assert head_ag.size_bytes == head_rs.size_bytes == spec.micro_batch_size * spec.shape().seq_len * \
            spec.shape().hidden * 2
    plain = TrainingSpec.model_validate({"model": "llama2-7b", "layers": 2, "parallel": {"tp": 2}})
    names = {o.name for o in training_ops(plain, 2).ops if isinstance(o, CollectiveOpSpec)}
    assert "B0.embed.bwd.all_gather" not in names and "B0.head.wgrad.ag" not in names
    assert {"F0.embed.all_reduce", "B0.head.all_reduce"} <= names


def test_gradients_reduced_in_fp32_where_asked() -> None:
    """``grad_reduce_fp32``: DDP's buckets carry 4 bytes a parameter (Llama 3's pre-training
    reduce-scattered its gradients in FP32: arXiv 2407.21783, section 3.3.2), 2 without it in BF16,
    and FSDP's reduce width is not modelled, so it is refused there."""
    def bucket_bytes(**parallel: Any) -> float:
        spec = TrainingSpec.model_validate({**SMALL, "precision": "bf16", "parallel": {"dp_mode": "ddp", **parallel}})
        return sum(o.size_bytes for o in training_ops(spec, 4).ops if isinstance(o, CollectiveOpSpec)
                   and o.stream == "dp")

    assert bucket_bytes(grad_reduce_fp32=True) == 2 * bucket_bytes() == 2 * bucket_bytes(grad_reduce_fp32=False)
    with pytest.raises(OvsimError, match="FSDP") as e:
        _predict({**SMALL, "parallel": {"dp_mode": "fsdp", "grad_reduce_fp32": True}})
    assert e.value.field == "training.parallel.grad_reduce_fp32"


def test_tensor_parallel_splits_gemms_and_adds_two_all_reduces_per_layer_each_way() -> None:
    """Megatron-LM (Shoeybi et al. 2019): f and g operators, two all-reduces in forward and two in
    backward per layer."""
    spec = TrainingSpec.model_validate({**SMALL, "embedding_and_head": False, "parallel": {"tp": 4}})
    ops = training_ops(spec, 4).ops
    ar = [o for o in ops if isinstance(o, CollectiveOpSpec) and o.kind == "all_reduce"]
    assert len(ar) == 4 * SMALL["layers"]
    one = training_ops(spec.model_copy(update={"parallel": spec.parallel.model_copy(update={"tp": 1})}), 1).ops
    flops_tp = sum(2 * o.m * o.n * o.k for o in ops if isinstance(o, GemmOp))
    flops_1 = sum(2 * o.m * o.n * o.k for o in one if isinstance(o, GemmOp))
    assert flops_tp * 4 == flops_1


def test_ddp_buckets_cover_every_gradient_once_on_the_last_micro_batch() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 3,
                                        "parallel": {"dp_mode": "ddp", "bucket_bytes": 8 * 2**20}})
    ops = training_ops(spec, 4).ops
    buckets = [o for o in ops if isinstance(o, CollectiveOpSpec)]
    m = spec.shape()
    # Every parameter's gradient, the learned position table's with the embedding's.
    grads = (m.layers * layer_params(m, 1) + m.vocab * m.hidden + m.seq_len * m.hidden) * 2
    assert sum(b.size_bytes for b in buckets) == pytest.approx(grads, rel=1e-9)
    # The first bucket is PyTorch's 1 MiB one; later ones reach the cap.
    assert buckets[0].size_bytes >= 2**20
    assert all(b.size_bytes >= 8 * 2**20 for b in buckets[1:-1])
    # Each bucket follows a backward op of the last micro-batch (no_sync before it).
    assert all(b.after[0].startswith("B2.") for b in buckets)


@pytest.mark.parametrize("pp", [1, 2])
def test_without_overlap_a_stage_reduces_its_gradients_in_one_collective_after_its_backward(pp: int) -> None:
    """Megatron-LM without --overlap-grad-reduce: each stage's gradients, the same bytes as the
    buckets', in one all-reduce that waits for the stage's last backward op; the iteration is
    then no shorter than with the buckets reduced beside backward, at a fixed clock (under the
    power limit, the overlapped buckets' power can cost the compute more clock than they hide)."""
    parallel = {"dp_mode": "ddp", "pp": pp, "bucket_bytes": 8 * 2**20}
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 4, "parallel": parallel})
    over = training_ops(spec, 4 * pp)
    spec_off = spec.model_copy(update={"parallel": spec.parallel.model_copy(update={"overlap_grad_reduce": False})})
    off = training_ops(spec_off, 4 * pp)
    def reductions(ops: list[Any], ranks: set[int]) -> list[CollectiveOpSpec]:
        # The data-parallel ones: not the tied embedding's sum across the pipeline's ends.
        return [o for o in ops if isinstance(o, CollectiveOpSpec) and o.stream == "dp" and set(o.ranks) & ranks
                and not o.name.startswith("embedding_grad_sum")]

    for s in range(pp):
        ranks = set(off.layout.stage_ranks(s))
        mine, theirs = reductions(off.ops, ranks), reductions(over.ops, ranks)
        assert len(mine) == 1 < len(theirs)
        assert mine[0].size_bytes == pytest.approx(sum(o.size_bytes for o in theirs), rel=1e-12)
        backward = [o.name for o in off.ops if o.stream == "compute" and o.name.startswith("B")
                    and set(o.ranks) & ranks]
        assert mine[0].after == [backward[-1]]
    training = {**SMALL, "micro_batches": 4, "parallel": parallel}
    t_over = _predict(training, system="hgx-h100", mode="analytic", power_managed=False).summary()["makespan_s"]
    t_off = _predict({**training, "parallel": {**parallel, "overlap_grad_reduce": False}}, system="hgx-h100",
                     mode="analytic", power_managed=False).summary()["makespan_s"]
    assert t_off >= t_over


@pytest.mark.parametrize("scatter_gather", [True, False])
def test_pipeline_transfers_scatter_and_gather_across_tensor_parallel_ranks(scatter_gather: bool) -> None:
    """Megatron-LM's scatter-gather (its default without sequence parallelism): each of the tp
    ranks sends 1/tp of a micro-batch's activation (b x s x h elements), and the receiving group
    all-gathers the whole of it before its next compute op; without it, each rank sends it all."""
    parallel = {"tp": 2, "pp": 2, "pipeline": "1f1b", "pipeline_scatter_gather": scatter_gather}
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 2, "parallel": parallel})
    m = spec.shape()
    full = spec.micro_batch_size * m.seq_len * m.hidden * 2
    ops = training_ops(spec, 4).ops
    sends = [o for o in ops if isinstance(o, SendRecvOp)]
    gathers = [o for o in ops if isinstance(o, CollectiveOpSpec) and o.name.endswith(".gather")]
    # Forward and backward, 2 micro-batches, one stage boundary, 2 tensor-parallel ranks.
    assert len(sends) == 2 * 2 * 2
    assert all(o.size_bytes == (full / 2 if scatter_gather else full) for o in sends)
    if not scatter_gather:
        assert gathers == []
        return
    assert len(gathers) == 2 * 2 and all(o.size_bytes == full and o.kind == "all_gather" for o in gathers)
    for gth in gathers:
        assert sorted(gth.after_any) == sorted(o.name for o in sends if o.name.startswith(gth.name[:-len(".gather")]))
        consumer = next(o for o in ops if gth.name in o.after_any)
        assert consumer.stream == "compute"


@pytest.mark.parametrize(("pipeline", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 4), (2, 6)])
def test_pipeline_bubble_matches_the_closed_forms(pipeline: str, v: int, p: int, m: int) -> None:
    """GPipe (Huang et al. 2019) and 1F1B: bubble = (p-1)/(m+p-1) of the iteration; interleaved
    1F1B (Narayanan et al., SC'21): bubble / ideal = (p-1)/(v*m). Uniform stages, no
    communication and no power-limit loop (which would give stages different clocks), as the
    formulas assume."""
    if pipeline == "interleaved" and m % p:
        pytest.skip("interleaved 1F1B needs micro-batches a multiple of stages")
    r = _predict({**SMALL, "layers": 16, "seq_len": 512, "micro_batches": m, "communication": False,
                  "embedding_and_head": False, "optimizer": False,
                  "parallel": {"pp": p, "pipeline": pipeline, "virtual_stages": v}},
                 system="hgx-h100" if p > 4 else "a100x4", power_managed=False)
    ops = r.ops[r.ops["rank"] >= 0]
    span = r.timeline.makespan_s
    for rank, busy in ops.groupby("rank")["duration_s"].sum().items():
        if pipeline == "interleaved":
            assert (span - busy) / busy == pytest.approx((p - 1) / (v * m), rel=0.01), rank
        else:
            assert 1 - busy / span == pytest.approx((p - 1) / (m + p - 1), rel=0.01), rank


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize(("pipeline", "p", "m", "v"), [("interleaved", 4, 16, 4), ("interleaved", 8, 32, 3),
                                                       ("1f1b", 4, 8, 1), ("1f1b", 8, 32, 1)])
def test_overlapped_pipeline_transfers_cost_at_most_one_per_exchange_step(recompute: str, pipeline: str, p: int,
                                                                          m: int, v: int) -> None:
    """Megatron-LM's stages exchange with their neighbours once a step (an item; in the interleaved
    steady state a forward and a backward), so with equal stages each step can wait for one
    transfer at most, and the first activation's way to the last stage and its gradient's way back
    add 2(p-1) more: the iteration exceeds the same schedule without communication by at most
    that many transfer times. With both directions of a stage pair on one stream, a backward
    gradient queued ahead of a ready activation stalled the stage behind it, to 1.2-1.4 times this
    bound (1F1B) and 2.3-3.8 times (interleaved)."""
    training = {**SMALL, "layers": 48, "seq_len": 2048, "micro_batches": m, "recompute": recompute,
                "embedding_and_head": False, "optimizer": False,
                "parallel": {"pp": p, "pipeline": pipeline, "virtual_stages": v}}
    system = "hgx-h100" if p > 4 else "a100x4"
    alone = _predict({**training, "communication": False}, system=system, mode="analytic", power_managed=False)
    r = _predict(training, system=system, mode="analytic", power_managed=False)
    transfers = r.ops[r.ops["stream"].str.startswith("pp")]
    assert not transfers.empty
    hops = len(set(exchange_steps(pipeline, p, 0, m, v))) + 2 * (p - 1)
    extra_s = r.timeline.makespan_s - alone.timeline.makespan_s
    assert 0 < extra_s <= hops * transfers["isolated_s"].max() * 1.001


@pytest.mark.parametrize("pipeline", ["gpipe", "1f1b", "interleaved"])
def test_every_stage_runs_each_micro_batch_forward_and_backward_once(pipeline: str) -> None:
    p, m, v = 4, 8, 2 if pipeline == "interleaved" else 1
    for s in range(p):
        order = stage_order(pipeline, p, s, m, v)
        assert sorted(order) == sorted([(ph, mb, c) for ph in "FB" for mb in range(m) for c in range(v)])
        for mb in range(m):
            for c in range(v):
                assert order.index(("F", mb, c)) < order.index(("B", mb, c))


def test_1f1b_keeps_at_most_p_minus_s_micro_batches_in_flight() -> None:
    """PipeDream-Flush's memory bound: stage s holds at most p - s activations."""
    p, m = 4, 8
    for s in range(p):
        live = peak = 0
        for ph, _, _ in stage_order("1f1b", p, s, m, 1):
            live += 1 if ph == "F" else -1
            peak = max(peak, live)
        assert peak == p - s


def test_pipeline_sends_activations_between_neighbouring_stages() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 4, "parallel": {"pp": 4}})
    sends = [o for o in training_ops(spec, 4).ops if isinstance(o, SendRecvOp)]
    # 3 boundaries x 4 micro-batches x (forward activation + backward gradient).
    assert len(sends) == 3 * 4 * 2
    assert {abs(o.src - o.dst) for o in sends} == {1}
    assert all(o.size_bytes == 1024 * 2048 * 2 for o in sends)


@pytest.mark.parametrize("schedule", ["overlapped", "sequential"])
@pytest.mark.parametrize("parallel", [
    {"dp_mode": "ddp"}, {"dp_mode": "fsdp"}, {"tp": 4}, {"tp": 2, "sequence_parallel": True},
    {"tp": 4, "sequence_parallel": True, "tp_overlap": "chunked"},
    {"tp": 4, "sequence_parallel": True, "tp_overlap": "copy_engine", "tp_chunks": 2},
    {"pp": 2, "pipeline": "1f1b"}, {"pp": 2, "pipeline": "interleaved", "virtual_stages": 2},
])
def test_every_layout_simulates_in_both_schedules(parallel: dict[str, Any], schedule: str) -> None:
    r = _predict({**SMALL, "layers": 4, "micro_batches": 2, "parallel": parallel}, schedule=schedule)
    s = r.summary()
    assert s["makespan_s"] > 0 and s["compute_s"] > 0


@pytest.mark.parametrize("schedule", ["overlapped", "sequential"])
def test_an_interleaved_pipeline_with_its_embedding_and_head_finishes(schedule: str) -> None:
    """Eight micro-batches over 4 stages of 2 chunks, embedding and head on the edge stages: a layout
    in which blocking each send/recv separately would leave every stage waiting on its neighbour."""
    r = _predict({**SMALL, "layers": 8, "micro_batches": 8,
                  "parallel": {"pp": 4, "pipeline": "interleaved", "virtual_stages": 2}}, schedule=schedule)
    assert r.summary()["makespan_s"] > 0


def test_analytic_and_simulated_agree_when_nothing_overlaps() -> None:
    training = {**SMALL, "layers": 4, "parallel": {"dp_mode": "fsdp"}}
    a = _predict(training, schedule="sequential", mode="analytic").summary()
    s = _predict(training, schedule="sequential").summary()
    assert s["makespan_s"] == pytest.approx(a["makespan_s"], rel=1e-6)


@pytest.mark.parametrize(("training", "field", "words"), [
    ({"parallel": {"tp": 3}}, "training.parallel", "does not divide the 4 ranks"),
    ({"heads": 6, "hidden": 1536, "parallel": {"tp": 4}}, "training.parallel.tp", "does not divide the 6"),
    # Megatron-LM divides the query groups over the tensor-parallel ranks; it repeats none.
    ({"heads": 8, "kv_heads": 2, "parallel": {"tp": 4}}, "training.parallel.tp",
     "does not divide the 2 key/value heads"),
    ({"parallel": {"bucket_bytes": 1e12}}, "training.parallel.bucket_bytes", "larger than"),
    ({"parallel": {"pp": 4}, "layers": 2}, "training.parallel.pp", "for 2 layers"),
    ({"parallel": {"pp": 2, "pipeline": "interleaved", "virtual_stages": 2}, "micro_batches": 3},
     "training.parallel.pipeline", "multiple of pp"),
    ({"parallel": {"dp_mode": "fsdp", "pp": 2}}, "training.parallel.dp_mode", "not modelled"),
    ({"model": "gpt5"}, "training.model", "unknown model"),
])
def test_invalid_training_scenarios_are_rejected_with_the_field(training: dict[str, Any], field: str,
                                                                words: str) -> None:
    with pytest.raises(OvsimError) as e:
        _predict({**SMALL, **training})
    assert e.value.field == field
    assert words in e.value.message


def _overlaps(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether any interval of ``a`` overlaps one of ``b`` on the same rank (beyond round-off)."""
    for r, ra in a.groupby("rank"):
        rb = b[b["rank"] == r]
        for s, e in zip(ra["start_s"], ra["end_s"], strict=True):
            if ((rb["start_s"] < e - 1e-12) & (rb["end_s"] > s + 1e-12)).any():
                return True
    return False


@pytest.mark.parametrize(("pipeline", "v"), [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_the_sequential_pipeline_blocks_on_each_transfer_and_on_nothing_else(pipeline: str, v: int) -> None:
    """Sequential pipeline = Megatron-LM's default (``batch_p2p_sync``: a device synchronize after
    each send/recv): no transfer runs beside its ranks' compute, nor (GPipe, 1F1B) beside one with
    the rank's other neighbour, and with equal stages a transfer holds the schedule up at most its
    own time, so the iteration is at most the same schedule without communication plus every
    transfer's isolated time (each counted once)."""
    base = {**SMALL, "layers": 8, "micro_batches": 4, "embedding_and_head": False,
            "parallel": {"pp": 4, "pipeline": pipeline, "virtual_stages": v}}
    seq = _predict(base, schedule="sequential", power_managed=False)
    off = _predict({**base, "communication": False}, schedule="sequential", power_managed=False)
    ops = seq.timeline.ops
    ends = {o.name: (o.src, o.dst) for o in training_ops(TrainingSpec.model_validate(base), 4).ops
            if isinstance(o, SendRecvOp)}
    sends = ops[ops["name"].isin(ends) & (ops["kind"] != "flow")]  # the NCCL kernels at both ends
    compute = ops[ops["kind"].isin(["gemm", "attention", "elementwise", "norm", "softmax"])]
    # (4 v - 1) boundaries x 4 micro-batches x 2 directions, both ends
    assert len(sends) == (4 * v - 1) * 4 * 2 * 2
    assert not _overlaps(sends, compute)
    if v == 1:
        # Megatron's non-interleaved schedule batches a send and a receive with one peer, never two.
        peer = sends.apply(lambda r: sum(ends[r["name"]]) - r["rank"], axis=1)
        below, above = sends[peer < sends["rank"]], sends[peer > sends["rank"]]
        assert len(below) and len(above) and not _overlaps(below, above)
    transfers_s = sends.drop_duplicates("name")["isolated_s"].sum()
    assert off.timeline.makespan_s < seq.timeline.makespan_s <= off.timeline.makespan_s + transfers_s


@pytest.mark.parametrize(("pipeline", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)])
@pytest.mark.parametrize(("pp", "tp", "dp"), [(2, 1, 1), (3, 1, 1), (4, 1, 1), (2, 2, 1), (2, 1, 2)])
@pytest.mark.parametrize("rounds", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_no_sequential_pipeline_waits_forever(pipeline: str, v: int, pp: int, tp: int, dp: int, rounds: int) -> None:
    """Blocking send/recv deadlocks where ranks each wait for a transfer the next has not reached;
    Megatron's schedules never do, and neither may their model, with or without the embedding and
    head (the engine reports ops that never finish). Micro-batches: 2 rounds - 1 (GPipe, 1F1B),
    rounds x pp (interleaved)."""
    parallel: dict[str, Any] = ({"pp": pp, "pipeline": pipeline, "virtual_stages": v, "tp": tp}
                                | ({"dp_mode": "ddp"} if dp > 1 else {}))
    micro_batches = rounds * pp if v > 1 else 2 * rounds - 1
    for head in (True, False):
        training = {**SMALL, "layers": 2 * pp * v, "seq_len": 256, "micro_batches": micro_batches,
                    "embedding_and_head": head, "parallel": parallel}
        sc = Scenario.model_validate({"name": "t", "system": "h100x4", "ranks": pp * tp * dp,
                                      "schedule": "sequential", "training": training})
        assert predict(sc, counters=False, power_managed=False).summary()["makespan_s"] > 0


def test_layers_that_do_not_split_evenly_leave_the_ends_lighter() -> None:
    """Llama 3 405B's 126 layers on 16 stages: one layer fewer on the first and the last stage
    (Grattafiori et al., arXiv 2407.21783, section 3.3.2); the rest get 8."""
    assert chunk_layers(126, 16) == [7] + [8] * 14 + [7]
    assert chunk_layers(96, 16) == [6] * 16  # an even split is unchanged
    for layers, chunks in [(125, 16), (100, 16), (81, 8), (17, 17), (61, 4)]:
        counts = chunk_layers(layers, chunks)
        assert sum(counts) == layers and max(counts) - min(counts) <= 1 and min(counts) >= 1
        # The lighter chunks sit at the ends: no chunk is lighter than one nearer the middle.
        half = chunks // 2
        assert counts[:half] == sorted(counts[:half]) and counts[chunks - half:] == sorted(counts[chunks - half:],
                                                                                         reverse=True)


def test_an_uneven_pipeline_runs_each_layer_once_on_its_stage() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "layers": 10, "micro_batches": 4, "parallel": {"pp": 4}})
    ops = training_ops(spec, 4).ops
    stage_of_layer: dict[int, set[int]] = {}
    for o in ops:
        if isinstance(o, GemmOp) and o.name.startswith("F0.L") and o.name.endswith(".qkv"):
            stage_of_layer.setdefault(int(o.name.split(".")[1][1:]), set()).update(o.ranks or [])
    # 10 layers on 4 stages: 2, 3, 3, 2.
    assert {layer: sorted(r) for layer, r in stage_of_layer.items()} == {
        0: [0], 1: [0], 2: [1], 3: [1], 4: [1], 5: [2], 6: [2], 7: [2], 8: [3], 9: [3]}
    r = _predict({**SMALL, "layers": 10, "micro_batches": 4, "parallel": {"pp": 4}})
    assert r.summary()["makespan_s"] > 0


def test_the_distributed_optimizer_reduce_scatters_buckets_and_gathers_them_after_the_step() -> None:
    base = {**SMALL, "micro_batches": 2}
    plain = [o for o in training_ops(TrainingSpec.model_validate(base), 4).ops if isinstance(o, CollectiveOpSpec)]
    spec = TrainingSpec.model_validate({**base, "parallel": {"distributed_optimizer": True}})
    ops = training_ops(spec, 4).ops
    colls = [o for o in ops if isinstance(o, CollectiveOpSpec)]
    buckets = [o.size_bytes for o in plain if o.kind == "all_reduce"]
    assert buckets and [o.size_bytes for o in colls if o.kind == "reduce_scatter"] == buckets
    gathers = [o for o in colls if o.kind == "all_gather"]
    assert [o.size_bytes for o in gathers] == buckets
    # The gathers follow the optimizer step, which steps a quarter of the parameters.
    opt = [o for o in ops if o.name == "s0.optimizer"]
    plain_opt = [o for o in training_ops(TrainingSpec.model_validate(base), 4).ops if o.name == "s0.optimizer"]
    assert all(g.after == ["s0.optimizer"] for g in gathers)
    assert opt[0].bytes == pytest.approx(plain_opt[0].bytes / 4)  # type: ignore[union-attr]
    fsdp = TrainingSpec.model_validate({**base, "parallel": {"dp_mode": "fsdp", "distributed_optimizer": True}})
    with pytest.raises(OvsimError, match="FSDP already shards"):
        training_ops(fsdp, 4)


def test_each_stage_steps_the_parameters_whose_gradients_it_reduces() -> None:
    """Uneven stages (10 layers on 4: 2, 3, 3, 2), the embedding on the first and the untied head on
    the last: each stage's optimizer steps exactly the parameters its DDP buckets carried (BF16
    gradients, 2 bytes; fused Adam moves 28 bytes a parameter in mixed precision)."""
    spec = TrainingSpec.model_validate({"model": "llama2-13b", "layers": 10, "seq_len": 512, "micro_batches": 4,
                                        "precision": "bf16", "parallel": {"pp": 4, "dp": 2}})
    ops = training_ops(spec, 8).ops
    stepped = []
    for s in range(4):
        reduced = sum(o.size_bytes for o in ops
                      if isinstance(o, CollectiveOpSpec) and o.name.startswith(f"s{s}.bucket"))
        opt = next(o for o in ops if o.name == f"s{s}.optimizer")
        assert opt.bytes / 28 == pytest.approx(reduced / 2)  # type: ignore[union-attr]
        stepped.append(reduced / 2)
    # The middle stages hold a layer more; the ends hold the embedding or the head instead.
    assert stepped[1] == stepped[2] and stepped[0] == stepped[3] != stepped[1]


def test_builds_within_a_search_reuse_the_op_specs_of_the_same_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside reusing_training_ops(), a workload of the same training spec with other knobs takes
    the op specs made for the one before (made once), a different spec makes its own, and the
    workloads are those built without reuse; outside it every build makes them."""
    import ovsim.models.training as tr
    from ovsim.models.training import reusing_training_ops
    from ovsim.scenario import load_scenario

    made: list[object] = []
    real = tr.training_ops

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(tr, "training_ops", counted)
    base = load_scenario(EXAMPLES / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml")
    assert base.training is not None
    other_knobs = base.model_copy(update={"knobs": base.knobs.model_copy(update={"nccl_channels": 4})})
    parallel = base.training.parallel.model_copy(update={"fsdp_prefetch": 2})
    other_spec = base.model_copy(update={"training": base.training.model_copy(update={"parallel": parallel})})
    plain = [build(sc)[0] for sc in (base, other_knobs, other_spec)]
    assert len(made) == 3
    made.clear()
    with reusing_training_ops():
        reused = [build(sc)[0] for sc in (base, other_knobs, other_spec, other_spec)]
    assert len(made) == 2  # the knobs' variant and the repeat took the specs of the build before
    assert [w.ops for w in reused] == [w.ops for w in (*plain, plain[2])]
    made.clear()
    build(base)
    assert len(made) == 1  # left: made again
    made.clear()
    monkeypatch.setattr(tr, "REUSE_MAX_SPECS", 10)  # a set this large is not held
    with reusing_training_ops():
        build(base)
        build(other_knobs)
    assert len(made) == 2
