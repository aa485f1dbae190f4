"""The schedule search's default space (:func:`ovsim.tune.default_space`): which knobs a scenario
leaves open and their values, the scenario's own first."""

from __future__ import annotations

from pathlib import Path

import yaml

from ovsim.api import predict
from ovsim.scenario import Scenario, load_scenario
from ovsim.tune import default_space
from ovsim.tune_candidates import candidates

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_default_space_holds_the_scenarios_own_values_first() -> None:
    sc = load_scenario(EXAMPLES / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml")
    space = default_space(sc)
    assert space["training.parallel.fsdp_prefetch"][0] == 1
    assert space["knobs.ce_offload"] == [False, True]
    assert "power.cap_w" not in space
    assert "power.cap_w" in default_space(sc, "energy")


def test_a_ddp_iteration_offers_megatrons_distributed_optimizer() -> None:
    """With data parallelism under DDP, sharding the optimizer (reduce-scatter, step on 1/dp,
    gather) is a schedule of its own; the scenario's choice (off) comes first."""
    sc = load_scenario(EXAMPLES / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml")
    assert default_space(sc)["training.parallel.distributed_optimizer"] == [False, True]
    fsdp = load_scenario(EXAMPLES / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml")
    assert "training.parallel.distributed_optimizer" not in default_space(fsdp)


def test_overlapped_gathers_are_offered_only_beside_the_distributed_optimizer(tmp_path: Path) -> None:
    """Megatron-LM's overlapped parameter gathers exist only with its distributed optimizer: the
    space offers them beside it, and a scenario that has both still gets plain DDP as a candidate
    (its gathers off), never a combination that cannot run."""
    sc = load_scenario(EXAMPLES / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml")
    assert default_space(sc)["training.parallel.overlap_param_gather"] == [False, True]
    knobs = ("training.parallel.distributed_optimizer", "training.parallel.overlap_param_gather")
    data = yaml.safe_load((EXAMPLES / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml").read_text())
    data["training"]["parallel"].update(distributed_optimizer=True, overlap_param_gather=True)
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump(data))
    for path in (EXAMPLES / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml", both):
        space = {k: v for k, v in default_space(load_scenario(path)).items() if k in knobs}
        found, dropped = candidates(path, space)
        points = {(c.point[knobs[0]], c.point[knobs[1]]) for c in found}
        assert points == {(False, False), (True, False), (True, True)}
        assert dropped["invalid"] == 0 and dropped["redundant"] == 1


def test_context_parallelism_offers_each_exchange_its_own_first() -> None:
    """Ring attention hides its exchanges behind the attention's steps; gathering the keys first
    runs fewer, larger collectives; Ulysses trades the sequence for the heads where they divide:
    which is fastest depends on the job, so each is searched."""
    data = yaml.safe_load((EXAMPLES / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml").read_text())
    data["training"]["parallel"].update(cp=2, cp_comm="all_gather")
    sc = Scenario.model_validate(data)
    # LLaMA2-70B's 8 key/value heads at TP 8 leave one a rank: Ulysses cannot split it.
    assert default_space(sc)["training.parallel.cp_comm"] == ["all_gather", "p2p"]
    data["training"]["parallel"].update(tp=4)
    assert default_space(Scenario.model_validate(data))["training.parallel.cp_comm"] == ["all_gather", "p2p", "a2a"]
    assert "training.parallel.cp_comm" not in default_space(load_scenario(
        EXAMPLES / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml"))


def test_rank_order_is_searched_where_a_node_holds_parts_of_several_stages_or_replicas() -> None:
    """Megatron-LM's order (stages outermost) and Llama 3's (data parallelism outermost) place the
    same ranks differently only where a stage's tp x cp is smaller than a node, pipelines and
    replicas are both there, and the job spans nodes; there the two are predicted and differ."""
    data = yaml.safe_load((EXAMPLES / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml").read_text())
    data["training"].update(micro_batches=4)
    data["training"]["parallel"].update(tp=4, pp=2, dp=4)
    sc = Scenario.model_validate(data)
    knob = "training.parallel.rank_order"
    assert default_space(sc)[knob] == ["tp-cp-dp-pp", "tp-cp-pp-dp"]
    data["training"]["parallel"]["rank_order"] = "tp-cp-pp-dp"
    assert default_space(Scenario.model_validate(data))[knob] == ["tp-cp-pp-dp", "tp-cp-dp-pp"]
    found, dropped = candidates(sc, {knob: ["tp-cp-dp-pp", "tp-cp-pp-dp"]})
    assert len(found) == 2 and dropped["invalid"] == 0
    spans = {c.point[knob]: predict(c.scenario, mode="analytic").timeline.makespan_s for c in found}
    assert spans["tp-cp-dp-pp"] != spans["tp-cp-pp-dp"]
    for change in ({"tp": 8, "pp": 2, "dp": 2}, {"tp": 4, "pp": 1, "dp": 8}, {"tp": 4, "pp": 8, "dp": 1}):
        data["training"]["parallel"].update(change)
        assert knob not in default_space(Scenario.model_validate(data)), change
    data["nodes"] = 1
    data["training"]["parallel"].update(tp=2, pp=2, dp=2)
    assert knob not in default_space(Scenario.model_validate(data))  # one node: the same links either way
