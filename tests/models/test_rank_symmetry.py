"""Rank symmetry: a training iteration's data-parallel replicas, and the ranks of each
tensor-parallel group, simulated once.

The golden result is the full simulation of every rank: on small jobs the symmetric run, expanded
to every rank, must give the same timeline and the same summary (round-off aside).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from ovsim.api import Result, predict
from ovsim.scenario import Scenario

JOBS: dict[str, dict[str, Any]] = {
    # TP inside a node, DDP across 2 nodes joined by NICs.
    "ddp-2-nodes": {"system": "hgx-h100-ndr", "nodes": 2, "training": {
        "model": "llama2-70b", "layers": 2, "micro_batch_size": 1, "precision": "bf16", "embedding_and_head": False,
        "parallel": {"tp": 8, "sequence_parallel": True, "dp_mode": "ddp"}}},
    # FSDP over 4 GPUs of one node: each replica is one GPU.
    "fsdp-one-node": {"system": "a100x4", "training": {
        "model": "gpt3-1.3b", "layers": 2, "micro_batch_size": 2, "precision": "fp16",
        "parallel": {"dp_mode": "fsdp", "fsdp_prefetch": 1}}},
    # A 2-stage 1F1B pipeline, 2 replicas.
    "pipeline-dp": {"system": "h100x4", "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"pp": 2, "pipeline": "1f1b"}}},
    # The same, sequential: each transfer blocks both ends (Megatron's batch_p2p_sync).
    "pipeline-dp-sequential": {"system": "h100x4", "schedule": "sequential", "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"pp": 2, "pipeline": "1f1b"}}},
    # TP 2 x PP 2 x DP 2 on one node: one rank of one replica's group per stage.
    "tp-pipeline-dp": {"system": "hgx-h100", "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"tp": 2, "pp": 2, "pipeline": "1f1b"}}},
    # The same, sequential, and interleaved: the blocking transfers name the job's ranks.
    "tp-interleaved-sequential": {"system": "hgx-h100", "schedule": "sequential", "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"tp": 2, "pp": 2, "pipeline": "interleaved", "virtual_stages": 2}}},
    # Stages on two nodes, their transfers over the NICs; no data parallelism.
    "tp8-pp2-2-nodes": {"system": "hgx-h100-ndr", "nodes": 2, "training": {
        "model": "llama2-70b", "layers": 2, "micro_batch_size": 1, "micro_batches": 2, "precision": "bf16",
        "parallel": {"tp": 8, "pp": 2, "sequence_parallel": True}}},
    # Chunked TP on copy engines beside FSDP over the other dimension.
    "tp-copy-engine-fsdp": {"system": "hgx-h100", "training": {
        "model": "gpt3-1.3b", "layers": 2, "micro_batch_size": 1, "precision": "bf16",
        "parallel": {"tp": 4, "dp_mode": "fsdp", "sequence_parallel": True, "tp_overlap": "copy_engine",
                     "tp_chunks": 2}}},
    # Tensor-parallel ranks alone stand for each other: 6-rank replicas straddle 8-GPU nodes.
    "tp-only-2-nodes": {"system": "hgx-h100-ndr", "nodes": 2, "ranks": 12, "training": {
        "model": "gpt3-1.3b", "layers": 6, "micro_batch_size": 1, "micro_batches": 3, "precision": "bf16",
        "parallel": {"tp": 2, "pp": 3, "pipeline": "1f1b"}}},
    # TP x PP x DP over two nodes under a power cap.
    "tp-pp-dp-2-nodes-capped": {"system": "hgx-h100-ndr", "nodes": 2, "power": {"cap_w": 450}, "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"tp": 2, "pp": 2, "pipeline": "1f1b"}}},
    # The same in Llama 3's order: a replica's two stages side by side.
    "tp-pipeline-dp-replicas-outer": {"system": "hgx-h100", "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"tp": 2, "pp": 2, "pipeline": "1f1b", "rank_order": "tp-cp-pp-dp"}}},
    # Two GPUs a NIC, Llama 3's order: 2-rank replicas (both stages), each on a NIC of its own,
    # stand for each other.
    "shared-nics": {"system": {"gpu": "h100-sxm5-80gb", "gpu_count": 8, "nodes": 2, "network": {
        "kind": "infiniband", "nics_per_node": 4, "bandwidth_per_nic_bytes_per_s": 50e9}}, "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"pp": 2, "pipeline": "1f1b", "rank_order": "tp-cp-pp-dp"}}},
    # Two GPUs a NIC, stages outermost: each replica's 2 tensor-parallel ranks of a stage on a NIC
    # of their own (those two share it, so both are simulated).
    "shared-nics-tp2": {"system": {"gpu": "h100-sxm5-80gb", "gpu_count": 8, "nodes": 2, "network": {
        "kind": "infiniband", "nics_per_node": 4, "bandwidth_per_nic_bytes_per_s": 50e9}}, "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"tp": 2, "pp": 2, "pipeline": "1f1b"}}},
    # Context parallelism across nodes: TP 8 x CP 2 x DP 2, keys and values gathered over the NICs.
    "cp-2-nodes-dp": {"system": "hgx-h100-ndr", "nodes": 4, "training": {
        "model": "llama2-70b", "layers": 2, "seq_len": 8192, "micro_batch_size": 1, "precision": "bf16",
        "embedding_and_head": False, "parallel": {"tp": 8, "cp": 2, "sequence_parallel": True,
                                                  "distributed_optimizer": True}}},
    # Context parallelism inside a node with a pipeline: TP 2 x CP 2 x PP 2, recomputed attention.
    "cp-tp-pipeline": {"system": "hgx-h100", "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 2, "precision": "bf16",
        "recompute": "selective", "parallel": {"tp": 2, "cp": 2, "pp": 2, "pipeline": "1f1b"}}},
    # Ulysses across nodes: TP 2 x CP 8 x DP 2 over 4 nodes, the heads traded over the NICs.
    "cp-ulysses-nodes": {"system": "hgx-h100-ndr", "nodes": 4, "training": {
        "model": "gpt3-1.3b", "layers": 2, "micro_batch_size": 1, "precision": "bf16",
        "parallel": {"tp": 2, "cp": 8, "cp_comm": "a2a"}}},
    # Communication off: a stage waits for the matching rank of the previous one.
    "tp-pipeline-no-comm": {"system": "hgx-h100", "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 2, "precision": "bf16",
        "communication": False, "parallel": {"tp": 2, "pp": 2, "pipeline": "1f1b"}}},
}


def _pair(job: dict[str, Any], **kw: Any) -> tuple[Result, Result]:
    sym = Scenario.model_validate(job)
    full = Scenario.model_validate({**job, "knobs": {"rank_symmetry": False}})
    return predict(sym, **kw), predict(full, **kw)


def _rows(ops: pd.DataFrame) -> pd.DataFrame:
    """Per-rank rows; a sequential pipeline's transfer streams are named by their ranks
    (p2p0>1), which a replica's copy keeps, so they compare as one."""
    per_rank = ops[ops["rank"] >= 0].copy()
    per_rank["stream"] = per_rank["stream"].where(~per_rank["stream"].str.startswith("p2p"), "p2p")
    return (per_rank[["rank", "stream", "start_s", "end_s"]].sort_values(["rank", "stream", "start_s", "end_s"])
            .reset_index(drop=True))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_one_replica_expanded_is_the_full_simulation(name: str) -> None:
    sym, full = _pair(JOBS[name])
    assert sym.workload.replicas == full.workload.total_ranks // sym.workload.n_ranks > 1
    assert full.workload.replicas == 1
    a, b = _rows(sym.expanded_ops()), _rows(full.timeline.ops)
    assert len(a) == len(b)
    assert (a["rank"] == b["rank"]).all() and (a["stream"] == b["stream"]).all()
    # A replica's op is its source's renamed to its own rank (names keep the source's group and
    # replica indices, as expanded_ops says): one id a row, each ending in its row's rank.
    rows = sym.expanded_ops().query("rank >= 0")
    assert rows["id"].is_unique
    assert all(i.endswith(f"@r{r}") for i, r in zip(rows["id"], rows["rank"], strict=True))
    assert a["start_s"].to_numpy() == pytest.approx(b["start_s"].to_numpy(), rel=1e-9, abs=1e-12)
    assert a["end_s"].to_numpy() == pytest.approx(b["end_s"].to_numpy(), rel=1e-9, abs=1e-12)
    sa, sb = sym.summary(), full.summary()
    assert sa["simulated_ranks"] == sym.workload.n_ranks and sb["simulated_ranks"] == sb["ranks"]
    for key, value in sb.items():
        if key in ("simulated_ranks", "calibration_files", "scenario"):
            continue
        if isinstance(value, float):
            assert sa[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert sa[key] == value, key


@pytest.mark.parametrize("name", ["ddp-2-nodes", "tp-pipeline-dp"])
def test_the_analytic_fidelity_takes_the_same_replica(name: str) -> None:
    """Time, power and energy: a collective's link power counts its whole group, simulated or not."""
    sym, full = _pair(JOBS[name], mode="analytic")
    sa, sb = sym.summary(), full.summary()
    for key, value in sb.items():
        if isinstance(value, float):
            assert sa[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize(("tp", "pp", "ranks", "order"), [(2, 3, 12, "tp-cp-pp-dp"), (2, 2, 12, "tp-cp-dp-pp"),
                                                      (2, 1, 16, "tp-cp-dp-pp")])
def test_replicas_that_do_not_tile_the_network_alike_run_in_full(tp: int, pp: int, ranks: int, order: str) -> None:
    """A 6-rank replica (Llama 3's order) on 8-GPU nodes straddles nodes unevenly, and so does a
    6-rank stage (stages outermost: 3 replicas of tp 2), which puts the first rank of the second
    stage's first replica on the first stage's node and that of its second on the next; 2-rank
    replicas on nodes whose 2 NICs each serve 4 GPUs share NICs with their neighbours. None stands
    for the others; nor do the ranks of a tensor-parallel group that share a NIC."""
    system: Any = "hgx-h100-ndr"
    if pp == 1:
        system = {"gpu": "h100-sxm5-80gb", "gpu_count": 8, "nodes": 2, "network": {
            "kind": "infiniband", "nics_per_node": 2, "bandwidth_per_nic_bytes_per_s": 50e9}}
    job = {"system": system, "nodes": 2, "ranks": ranks, "training": {
        "model": "gpt3-1.3b", "layers": 6, "micro_batch_size": 1, "micro_batches": 6, "precision": "bf16",
        "parallel": {"tp": tp, "pp": pp, "pipeline": "1f1b", "rank_order": order}}}
    if pp == 1:
        del job["nodes"]
        job["training"]["parallel"] = {"tp": tp}
    wl = predict(Scenario.model_validate(job), mode="analytic").workload
    assert wl.n_ranks * wl.replicas == ranks
    # Only a tensor-parallel group's ranks stand for each other, and not where they share NICs.
    assert wl.stand_offsets == ((0, 1) if pp > 1 else ())


def test_stages_that_tile_a_node_stand_for_their_replicas() -> None:
    """Stages outermost, TP 2 x PP 3 x DP 2 on 12 ranks: each stage's 4 ranks tile the 8-GPU
    nodes (stages 0 and 1 on the first, 2 on the second), so each stage's replicas stand for
    each other, where a replica of all three stages (Llama 3's order, above) straddles nodes."""
    job = {"system": "hgx-h100-ndr", "nodes": 2, "ranks": 12, "training": {
        "model": "gpt3-1.3b", "layers": 6, "micro_batch_size": 1, "micro_batches": 3, "precision": "bf16",
        "parallel": {"tp": 2, "pp": 3, "pipeline": "1f1b"}}}
    wl = predict(Scenario.model_validate(job), mode="analytic").workload
    # Ranks (stage x 2 + replica) x 2 + tp rank: replica 0's tp rank 0 of each stage.
    assert wl.job_ranks == (0, 4, 8) and wl.stand_offsets == (0, 1, 2, 3)


def test_replicas_that_group_their_ranks_onto_nics_differently_run_in_full() -> None:
    """8 GPUs on 5 NICs share them as ports 0,0,1,1,2,3,3,4: with 4-stage replicas, replica 0
    pairs stages 0+1 and 2+3 on a NIC and replica 1 stages 1+2, so neither stands for the other
    (the two differed by 3% in the iteration's time when it did)."""
    job = {"system": {"gpu": "h100-sxm5-80gb", "gpu_count": 8, "nodes": 2, "network": {
        "kind": "infiniband", "nics_per_node": 5, "bandwidth_per_nic_bytes_per_s": 50e9}}, "training": {
        "model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16",
        "parallel": {"pp": 4, "pipeline": "1f1b"}}}
    wl = predict(Scenario.model_validate(job), mode="analytic").workload
    assert wl.replicas == 1 and wl.n_ranks == 16


def test_a_mesh_node_runs_every_rank() -> None:
    """Mesh links join particular pairs, so one replica's traffic does not stand for another's."""
    job = {**JOBS["fsdp-one-node"], "system": "v100x8-dgx1"}
    job["training"] = {**job["training"], "precision": "fp16"}
    result = predict(Scenario.model_validate(job), mode="analytic")
    assert result.workload.replicas == 1 and result.workload.n_ranks == 8


def test_a_collectives_link_power_counts_its_whole_group(h100: Any, h100_calib: Any) -> None:
    """Under symmetry a collective lists only its simulated members (group_size says how many it
    has): its link traffic, and so its link power, is that of the whole ring."""
    from dataclasses import replace

    from ovsim.engine.power_analytic import isolated_activity
    from ovsim.hw.power import power_model
    from ovsim.models.ir import FlowDemand, Op

    flow = FlowDemand(group="g", ranks=(0, 8), bytes=1e9, latency_s=1e-5, rate_cap_bytes_per_s=1e11,
                      link_coeff=1.0, hbm_coeff=2.0, pattern="ring")
    model = power_model(h100, h100_calib.params)
    whole = isolated_activity(Op("a", "a", "collective", 0, "s", flow=flow), h100, model)
    one = isolated_activity(Op("a", "a", "collective", 0, "s", flow=replace(flow, ranks=(0,), group_size=2)),
                            h100, model)
    assert whole.link_bytes_per_s > 0
    assert one == whole


def test_the_op_limit_counts_the_ops_simulated() -> None:
    """--max-ops bounds the ops the simulated ranks run (here one rank of each of 2 stages), not
    the job's: the limit at that count passes, one below is refused with the count."""
    from ovsim.api import build
    from ovsim.errors import OvsimError

    sc = Scenario.model_validate(JOBS["tp-pipeline-dp"])
    wl = build(sc)[0]
    # Ranks (stage x 2 + replica) x 2 + tp rank (Megatron-LM's order): stage 1 starts at rank 4.
    assert wl.job_ranks == (0, 4) and wl.stand_offsets == (0, 1, 2, 3)
    assert len(build(sc, max_ops=len(wl.ops))[0].ops) == len(wl.ops)
    with pytest.raises(OvsimError, match=f"{len(wl.ops):,} ops"):
        build(sc, max_ops=len(wl.ops) - 1)


def test_predict_all_ranks_writes_every_rank(tmp_path: Any, capsys: Any) -> None:
    """`ovsim predict --all-ranks` writes the job's every rank, as the full simulation has them, in
    --json and --timeline; over --max-ops it is refused with the row count, exit status non-zero."""
    import json

    import yaml

    from ovsim.cli.main import main

    job = {"schema": "ovsim.scenario/1", "name": "tp-pipeline-dp", **JOBS["tp-pipeline-dp"]}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    timeline = tmp_path / "t.json"
    assert main(["predict", str(path), "--mode", "analytic", "--json", "--all-ranks", "--timeline",
                 str(timeline)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["simulated_ranks"] == 2 and out["summary"]["ranks"] == 8
    assert sorted(p["rank"] for p in out["power"]) == list(range(8))
    assert {s["rank"] for s in out["streams"]} == set(range(8))
    full = predict(Scenario.model_validate({**job, "knobs": {"rank_symmetry": False}}), mode="analytic")
    a = _rows(pd.DataFrame(out["ops"]))
    b = _rows(full.timeline.ops)
    assert len(a) == len(b) and (a["rank"] == b["rank"]).all()
    assert a["end_s"].to_numpy() == pytest.approx(b["end_s"].to_numpy(), rel=1e-9, abs=1e-12)
    events = json.loads(timeline.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert {e["args"]["name"] for e in events if e.get("name") == "process_name"} >= {f"rank {r}" for r in range(8)}
    # The simulated ranks' 474 ops pass a limit of 1,000; the job's 1,896 per-rank rows do not.
    assert main(["predict", str(path), "--mode", "analytic", "--json", "--all-ranks", "--max-ops", "1000"]) != 0
    err = capsys.readouterr().err
    assert "--all-ranks: every rank of the job is" in err and "rows, over the limit of 1,000" in err
    # Alone it would change nothing the command prints: refused, before any work.
    assert main(["predict", str(path), "--mode", "analytic", "--all-ranks"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--all-ranks: widens --json's ops and --timeline" in err
