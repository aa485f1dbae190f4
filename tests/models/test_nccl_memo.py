"""A build plans each kind of collective once (nccl.plan_collective's memo): the memo returns what
planning afresh gives, and tells apart what a plan depends on."""

from __future__ import annotations

from ovsim.hw.spec import load_gpu, load_system
from ovsim.models import nccl

GPU = load_gpu("h100-sxm5-80gb")


def test_the_memo_gives_the_fresh_plan_and_keys_on_what_the_plan_depends_on() -> None:
    system = load_system("hgx-h100-ndr").model_copy(update={"nodes": 4})
    memo: dict[tuple[object, ...], nccl.CollectivePlan] = {}
    cases = [("all_reduce", 1e8, list(range(8))), ("all_reduce", 1e8, list(range(8, 16))),  # another node, alike
             ("all_reduce", 1e8, [0, 1, 2, 3, 8, 9, 10, 11]),  # two nodes: another plan
             ("all_reduce", 2e8, list(range(8))), ("all_gather", 1e8, list(range(8))),
             ("all_reduce", 1e8, list(range(0, 32, 8)))]  # one rank a node
    for op, size, ranks in cases:
        fresh = nccl.plan_collective(op, size, len(ranks), GPU, system, ranks=ranks)
        assert nccl.plan_collective(op, size, len(ranks), GPU, system, ranks=ranks, memo=memo) == fresh
    # The second case reused the first's plan; every other one is its own.
    assert len(memo) == len(cases) - 1
    two_nodes = nccl.plan_collective("all_reduce", 1e8, 8, GPU, system, ranks=[0, 1, 2, 3, 8, 9, 10, 11], memo=memo)
    assert two_nodes.n_nodes == 2 and two_nodes != nccl.plan_collective("all_reduce", 1e8, 8, GPU, system, memo=memo)
