"""Context parallelism: each rank holds two of the sequence's 2 x cp chunks and exchanges keys and
values with its group, all-gathered before its attention as Llama 3 ran it (Grattafiori et al.,
arXiv 2407.21783, section 3.3.2; Transformer Engine's ``AttnFuncWithCPAndKVAllGather``), or
passed round a ring beside the attention's steps (``AttnFuncWithCPAndKVP2P``, Megatron-LM's
default)."""

from __future__ import annotations

from typing import Any

import pytest
from training_cases import SMALL
from training_cases import predict_training as _predict

from ovsim.errors import OvsimError
from ovsim.models.memory import memory_estimate
from ovsim.models.training import training_ops
from ovsim.models.training_layout import layout
from ovsim.models.training_spec import TrainingSpec
from ovsim.models.workload import AttentionOp, CollectiveOpSpec, GemmOp

# GPT-3 1.3B's shape: hidden 2,048, 16 heads of 128 (Brown et al., 2020; 16 heads as implemented).
HIDDEN, HEADS, HEAD_DIM = 2048, 16, 128


def _spec(training: dict[str, Any] | None = None, **parallel: Any) -> TrainingSpec:
    return TrainingSpec.model_validate({**SMALL, "layers": 2, **(training or {}), "parallel": parallel})


def _masked_products(seq: int, cp: int, rank: int) -> int:
    """Query-key products rank ``rank`` computes under the causal mask, counted one query at a
    time: it holds chunks ``rank`` and ``2cp - 1 - rank`` of ``2cp``, and query p meets keys 0..p."""
    chunk = seq // (2 * cp)
    return sum(p + 1 for j in (rank, 2 * cp - 1 - rank) for p in range(j * chunk, (j + 1) * chunk))


def test_ranks_sit_tp_innermost_then_cp() -> None:
    """TP 2 x CP 2 x PP 2 x DP 2 on 16 ranks, in Megatron-LM's default order ("tp-cp-ep-dp-pp",
    innermost first): rank = ((stage x replicas + replica) x cp + cp rank) x tp + tp rank, so a
    stage's replicas sit side by side, each over tp x cp consecutive ranks."""
    lay = layout(_spec(tp=2, cp=2, pp=2), 16)
    assert (lay.dp, lay.cp) == (4, 2)  # the gradient group: replicas x context-parallel ranks
    assert lay.cp_groups(0) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.cp_groups(1) == [[8, 10], [9, 11], [12, 14], [13, 15]]
    # Gradients are reduced over both replicas' both context-parallel ranks.
    assert lay.dp_groups(0)[0] == [0, 2, 4, 6]
    assert lay.tp_groups(1)[1] == [10, 11]


def test_ranks_sit_replica_outermost_in_llama3_order() -> None:
    """The same job in Llama 3's order ([TP, CP, PP, DP] innermost first; Megatron-LM's
    ``--use-tp-pp-dp-mapping``): rank = ((replica x pp + stage) x cp + cp rank) x tp + tp rank,
    so a replica's stages sit side by side."""
    lay = layout(_spec(tp=2, cp=2, pp=2, rank_order="tp-cp-pp-dp"), 16)
    assert lay.cp_groups(0) == [[0, 2], [1, 3], [8, 10], [9, 11]]
    assert lay.cp_groups(1) == [[4, 6], [5, 7], [12, 14], [13, 15]]
    assert lay.dp_groups(0)[0] == [0, 2, 8, 10]
    assert lay.tp_groups(1)[1] == [6, 7]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_each_rank_does_one_cpth_of_the_causal_attention(cp: int, h100: Any, h100_calib: Any) -> None:
    """Counted product by product, every rank's two chunks make the same work (the balance the
    chunk pairing exists for), and the priced FLOPs of a rank's queries against the gathered
    sequence are 1/cp of the whole attention's, as that count says to leading order."""
    from ovsim.models.cost import attention

    seq = 4096
    counts = {_masked_products(seq, cp, r) for r in range(cp)}
    assert len(counts) == 1
    (count,) = counts
    assert count * cp == seq * (seq + 1) // 2
    gpu, params = h100, h100_calib.params
    whole = attention(1, 8, seq, 128, "bf16", gpu, params).flops
    mine = attention(1, 8, seq // cp, 128, "bf16", gpu, params, kv_len=seq).flops
    assert mine * cp == pytest.approx(whole, rel=1e-12)
    # Leading order of the count: 4 x heads x head size FLOPs a product (QK^T and PV, 2 each).
    assert mine == pytest.approx(4 * 8 * 128 * count, rel=2 * cp / seq)


def test_a_rank_gathers_the_keys_and_values_and_reduces_their_gradients() -> None:
    """TP 2 x CP 4 on 8 GPUs: per layer and micro-batch, the keys and the values all-gathered
    before the forward attention and again before its backward, and their gradients
    reduce-scattered after it, each micro-batch x sequence x kv heads / tp x head size elements of
    2 bytes; the attention runs the rank's 1/4 of the queries against the whole sequence, the
    linears on its 1/4 of the tokens."""
    spec = _spec(tp=2, cp=4, cp_comm="all_gather")
    gen = training_ops(spec, 8)
    seq = SMALL["seq_len"]
    kv_bytes = 1 * seq * HEADS // 2 * HEAD_DIM * 2
    cps = [o for o in gen.ops if isinstance(o, CollectiveOpSpec) and o.stream == "cp"]
    layer0 = sorted(o.name for o in cps if ".L0." in o.name and o.ranks[0] == 0)
    assert layer0 == ["B0.L0.attn.bwd.cp.dk.rs.g0", "B0.L0.attn.bwd.cp.dv.rs.g0", "B0.L0.attn.bwd.cp.k.ag.g0",
                      "B0.L0.attn.bwd.cp.v.ag.g0", "F0.L0.attn.cp.k.ag.g0", "F0.L0.attn.cp.v.ag.g0"]
    assert {o.size_bytes for o in cps} == {kv_bytes}
    assert {tuple(o.ranks) for o in cps} == {(0, 2, 4, 6), (1, 3, 5, 7)}
    assert {o.kind for o in cps} == {"all_gather", "reduce_scatter"}
    attn = [o for o in gen.ops if isinstance(o, AttentionOp)]
    assert {(o.seq_len, o.kv_len) for o in attn} == {(seq // 4, seq)}
    qkv = next(o for o in gen.ops if isinstance(o, GemmOp) and o.name == "F0.L0.qkv")
    assert qkv.m == seq // 4


def test_the_attention_waits_for_its_gathers_and_the_qkv_backward_for_the_reductions() -> None:
    result = _predict({**SMALL, "layers": 2, "parallel": {"tp": 2, "cp": 2, "cp_comm": "all_gather"}},
                      system="h100x4", mode="analytic")
    ops = result.timeline.ops.set_index("id")
    for pre in ("F0.L1", "B0.L1"):
        attn = f"{pre}.attn" + (".bwd" if pre[0] == "B" else "")
        gathers = ops.loc[[f"{attn}.cp.{x}.ag.g0@r0" for x in "kv"], "end_s"]
        assert ops.loc[f"{attn}@r0", "start_s"] >= gathers.max() > 0
    reduced = ops.loc[[f"B0.L1.attn.bwd.cp.d{x}.rs.g0@r0" for x in "kv"], "end_s"].max()
    assert ops.loc["B0.L1.qkv.dgrad@r0", "start_s"] >= reduced


@pytest.mark.parametrize("cp", [2, 4])
def test_a_ring_passes_each_block_beside_the_attentions_steps(cp: int, h100: Any, h100_calib: Any) -> None:
    """Ring attention on TP 2 x CP cp: per layer and micro-batch, cp steps forward and backward.
    Step 0 is the rank's own block under the mask, each later step its second chunk's queries
    against a whole block: together 1/cp of the whole causal attention's FLOPs, exactly. The
    forward passes cp - 1 blocks on (keys and values of the rank's tokens), the backward cp
    (blocks, then blocks and their gradients, then the gradients alone)."""
    from ovsim.models.cost import attention

    seq = SMALL["seq_len"]
    local = seq // cp
    gen = training_ops(_spec(tp=2, cp=cp), 2 * cp)
    fwd = [o for o in gen.ops if isinstance(o, AttentionOp) and o.name.startswith("F0.L0.attn")]
    assert [(o.seq_len, o.kv_len, o.causal) for o in fwd] == [(local, None, True)] + [(local // 2, local, False)] * (
        cp - 1)
    heads = HEADS // 2
    whole = attention(1, heads, seq, HEAD_DIM, "bf16", h100, h100_calib.params).flops
    steps = sum(attention(1, heads, o.seq_len, HEAD_DIM, "bf16", h100, h100_calib.params, kv_len=o.kv_len,
                          causal=o.causal).flops for o in fwd)
    assert steps * cp == pytest.approx(whole, rel=1e-12)
    block = 2 * local * (HEADS // 2) * HEAD_DIM * 2  # keys and values, 2 bytes each
    ring = [o for o in gen.ops if isinstance(o, CollectiveOpSpec) and o.kind == "ring_exchange" and ".L0." in o.name
            and o.ranks[0] == 0]
    assert [o.size_bytes for o in ring if o.name.startswith("F0.")] == [block] * (cp - 1)
    back = [o.size_bytes for o in ring if o.name.startswith("B0.")]
    assert back == [block] + [2 * block] * (cp - 2) + [block]
    assert {tuple(o.ranks) for o in ring} == {tuple(range(0, 2 * cp, 2))}


def _ring_step_shapes(seq: int, cp: int, rank: int) -> list[tuple[int, int]]:
    """(queries, keys) of rank ``rank``'s steps after the first, from the masked products counted
    token by token: at step i it holds the block of rank (rank - i) mod cp, and its queries that
    meet any of a key chunk's keys meet them all."""
    chunk = seq // (2 * cp)
    mine = (rank, 2 * cp - 1 - rank)
    shapes = []
    for i in range(1, cp):
        held = ((rank - i) % cp, 2 * cp - 1 - (rank - i) % cp)
        queries = {q for q in mine if any(k < q for k in held)}
        keys = {k for k in held if any(k < q for q in mine)}
        shapes.append((len(queries) * chunk, len(keys) * chunk))
    return shapes


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_a_ring_step_is_priced_as_its_slowest_ranks(cp: int, h100: Any, h100_calib: Any, a100: Any) -> None:
    """Rank c runs c later steps of its whole queries against half a block and cp - 1 - c of half
    its queries against a whole block (counted chunk by chunk); each step waits for its ring
    neighbour's block, so its price is the slower shape's, on GPUs where either is the slower
    (few blocks fill one wave faster in more, smaller blocks)."""
    from ovsim.hw.calib import load_calibration
    from ovsim.models.cost import attention
    from ovsim.models.op_prices import kernel_demand
    from ovsim.models.op_specs import Knobs

    seq, local = 8192, 8192 // cp
    assert {s for r in range(cp) for s in _ring_step_shapes(seq, cp, r)} == {(local, local // 2), (local // 2, local)}
    assert _ring_step_shapes(seq, cp, 0) == [(local // 2, local)] * (cp - 1)
    for gpu, params in ((h100, h100_calib.params), (a100, load_calibration(a100, "a100-sxm4-40gb").params)):
        for heads in (2, 8, 32):
            for backward in (False, True):
                op = AttentionOp(name="s", kind="attention", batch=1, heads=heads, seq_len=local // 2, kv_len=local,
                                 head_dim=HEAD_DIM, causal=False, backward=backward, ring_step=True)
                priced = kernel_demand(op, gpu, params, Knobs()).isolated_s
                alone = [attention(1, heads, q, HEAD_DIM, "bf16", gpu, params, kv_len=k, causal=False,
                                   backward=backward).isolated_s for q, k in ((local // 2, local), (local, local // 2))]
                assert priced == max(alone)


def test_a_backward_blocks_over_the_keys_and_loops_over_the_queries(h100: Any, h100_calib: Any) -> None:
    """FlashAttention-2's backward makes each key block's gradients in one thread block, looping
    over the queries (Dao, arXiv 2307.08691, section 3.2): a rank's few queries against the whole
    gathered sequence make many short loops, slower a product than the forward's few long ones
    would suggest; with queries and keys alike nothing changes."""
    from ovsim.models.cost import attention

    gpu, params = h100, h100_calib.params
    # Enough heads that either grid fills its waves (132 SMs, a block each): their count does not decide.
    few = attention(4, 32, 1024, HEAD_DIM, "bf16", gpu, params, kv_len=8192, causal=True, backward=True)
    many = attention(4, 32, 8192, HEAD_DIM, "bf16", gpu, params, kv_len=1024, causal=True, backward=True)
    assert few.blocks == 128 * 8192 // 128 and many.blocks == 128 * 1024 // 128
    assert few.flops == many.flops and few.isolated_s > 1.2 * many.isolated_s
    fwd = attention(4, 32, 1024, HEAD_DIM, "bf16", gpu, params, kv_len=8192, causal=True)
    assert fwd.blocks == 128 * 1024 // 128


def test_each_ring_step_waits_for_the_block_the_step_before_received() -> None:
    result = _predict({**SMALL, "layers": 2, "parallel": {"tp": 2, "cp": 2}}, system="h100x4", mode="analytic")
    ops = result.timeline.ops.set_index("id")
    for pre in ("F0.L1.attn", "B0.L1.attn.bwd"):
        received = ops.loc[f"{pre}.cp.x0.g0@r0", "end_s"]
        assert ops.loc[f"{pre}.cp1@r0", "start_s"] >= received > ops.loc[f"{pre}.cp0@r0", "start_s"]
    # The backward's last exchange (the gradients alone) comes before the QKV projection's backward.
    assert ops.loc["B0.L1.qkv.dgrad@r0", "start_s"] >= ops.loc["B0.L1.attn.bwd.cp.x1.g0@r0", "end_s"]


def test_a_ring_exchange_across_nodes_moves_at_a_nics_rate() -> None:
    """Four ranks on four nodes each send 1 GB to the next and receive as much: at least the 1 GB
    over one 400 Gb/s NIC a GPU (50 GB/s, the HGX H100 NDR nodes' ConnectX-7), at most a third
    slower; inside one node, at least NVLink's 450 GB/s a direction would allow."""
    from ovsim.api import predict
    from ovsim.scenario import Scenario

    def exchange_s(ranks: list[int], nodes: int) -> float:
        sc = Scenario.model_validate({"name": "x", "system": "hgx-h100-ndr", "nodes": nodes, "mode": "analytic",
                                      "ops": [{"name": "x", "kind": "ring_exchange", "size_bytes": 1e9,
                                               "ranks": ranks}]})
        return float(predict(sc).timeline.makespan_s)

    across = exchange_s([0, 8, 16, 24], 4)
    assert 1e9 / 50e9 <= across <= 1.33 * 1e9 / 50e9
    assert exchange_s([0, 1, 2, 3], 1) >= 1e9 / 450e9


@pytest.mark.parametrize(("extra", "field"), [({"algorithm": "tree"}, "algorithm"), ({"ranks": [0]}, "ranks"),
                                              ({"engine": "copy_engine"}, "engine")])
def test_what_a_ring_exchange_refuses(extra: dict[str, Any], field: str) -> None:
    from ovsim.api import build
    from ovsim.scenario import Scenario

    sc = Scenario.model_validate({"name": "x", "system": "hgx-h100", "ops": [
        {"name": "x", "kind": "ring_exchange", "size_bytes": 1e6, "ranks": [0, 1], **extra}]})
    with pytest.raises(OvsimError) as e:
        build(sc)
    assert e.value.field == f"ops.x.{field}"


def test_ulysses_trades_the_sequence_for_the_heads_and_back() -> None:
    """cp_comm a2a on TP 2 x CP 2: the queries, keys and values all-to-all'd before the forward
    attention and its output after (each a rank's tokens of its heads: micro-batch x seq / cp x
    heads / tp x head size elements of 2 bytes), the attention of the whole sequence over a
    quarter of the heads; backward the output's gradient before and the three gradients after."""
    gen = training_ops(_spec(tp=2, cp=2, cp_comm="a2a"), 4)
    seq = SMALL["seq_len"]
    tensor = 1 * seq // 2 * HEADS // 2 * HEAD_DIM * 2
    a2a = [o for o in gen.ops if isinstance(o, CollectiveOpSpec) and o.kind == "all_to_all" and ".L0." in o.name
           and o.ranks[0] == 0]
    assert [o.name.split(".cp.")[1] for o in a2a] == ["q.a2a.g0", "k.a2a.g0", "v.a2a.g0", "o.a2a.g0", "do.a2a.g0",
                                                      "dq.a2a.g0", "dk.a2a.g0", "dv.a2a.g0"]
    assert {o.size_bytes for o in a2a} == {tensor}  # GPT-3's heads are all key/value heads too
    attn = [o for o in gen.ops if isinstance(o, AttentionOp)]
    assert {(o.seq_len, o.kv_len, o.heads) for o in attn} == {(seq, None, HEADS // 4)}


def test_ulysses_needs_the_heads_to_divide() -> None:
    """Llama 3 8B's 8 key/value heads leave 1 a rank at TP 8: no split over 2 context-parallel ranks."""
    spec = TrainingSpec.model_validate({"model": "llama3-8b", "layers": 2, "micro_batch_size": 1,
                                        "precision": "bf16", "parallel": {"tp": 8, "cp": 2, "cp_comm": "a2a"}})
    with pytest.raises(OvsimError, match="1 key/value heads") as e:
        layout(spec, 16)
    assert e.value.field == "parallel.cp_comm"


def test_a_rank_holds_one_cpth_of_the_activations() -> None:
    """Korthikanti et al.'s activations are linear in the tokens a rank holds (flash attention
    keeps no s x s scores), so 4 context-parallel ranks hold a quarter each."""
    one = memory_estimate(_spec(tp=2), 2)
    four = memory_estimate(_spec(tp=2, cp=4), 8)
    assert four.activations_bytes * 4 == pytest.approx(one.activations_bytes, rel=1e-12)
    assert four.weights_bytes == one.weights_bytes


def test_without_communication_nothing_is_gathered() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "layers": 2, "communication": False, "parallel": {"cp": 2}})
    assert not [o for o in training_ops(spec, 2).ops if isinstance(o, CollectiveOpSpec)]


@pytest.mark.parametrize(("training", "parallel", "ranks", "field", "says"), [
    ({"seq_len": 1004}, {"cp": 4}, 4, "parallel.cp", "8 chunks"),
    ({"attention": "unfused"}, {"cp": 2}, 2, "attention", "unfused attention"),
    ({}, {"cp": 2, "dp_mode": "fsdp"}, 4, "parallel.dp_mode", "FSDP"),
    ({"precision": "amp_bf16"}, {"cp": 2}, 2, "precision", "autocast"),
    ({}, {"cp": 3}, 4, "parallel", "cp 3"),
])
def test_what_context_parallelism_refuses(training: dict[str, Any], parallel: dict[str, Any], ranks: int,
                                          field: str, says: str) -> None:
    with pytest.raises(OvsimError, match=says) as e:
        layout(_spec(training, **parallel), ranks)
    assert e.value.field == field
