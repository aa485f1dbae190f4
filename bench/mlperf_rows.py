"""NVIDIA's MLPerf Training v3.1 GPT-3 175B runs: 512 to 10,752 H100s, each step's time logged.

Source: mlcommons/training_results_v3.1 (commit f33f9444), NVIDIA's closed-division GPT-3
submissions on Eos (DGX H100: eight H100-SXM5-80GB and eight ConnectX-7 400 Gb/s NDR InfiniBand NICs
a node; systems/*.json). Each run's ``NVIDIA/results/<system>/gpt3/result_0.txt`` logs every
training step's ``train_step_timing`` (MLLOG ``tracked_stats``, evaluation excluded); a row's
published step is the median of the last 20 steps logged there (the first step after each
evaluation, 0.3-5% faster, is among them). Its configuration
(``NVIDIA/benchmarks/gpt3/implementations/pytorch/``):

- ``config_DGXH100_<nodes>x8x<MINIBS>x4x8_mbs1.sh``: TP 4, PP 8, one sequence a micro-batch,
  ``MINIBS`` sequences a data-parallel replica (the global batch is MINIBS x dp, as
  ``conf/custom.yaml`` computes it), Transformer Engine's tensor-parallel communication overlap
  (``TP_COMM_OVERLAP=True``: ovsim's ``tp_overlap: chunked``). The 64-node run's file is not in that
  copy: its log gives the global batch (2,048) and 128 micro-batches, so the same TP 4 x PP 8.
- ``config_fp8.sh``: FP8 (hybrid) GEMMs.
- ``conf/custom.yaml``: 12 virtual stages, sequence parallelism, no activation recomputation, BF16
  otherwise, sequences of 2,048, GPT-3 175B (96 layers, hidden 12,288, 96 heads).
- Ranks in Megatron-LM's order, pipeline stages outermost (ovsim's default ``rank_order``): the
  Megatron-core NeMo ran in 2023 built its groups in no other.

Assumed where that copy is silent (its ``config_common.sh`` and ``run_and_time.sh`` are not in
it): the distributed optimizer with its gradient reduce-scatters and parameter gathers overlapped
(``distributed_fused_adam`` with ``overlap_grad_sync`` and ``overlap_param_sync`` on, the
defaults of v3.0's run_and_time.sh and v4.0's conf/optim/distributed_fused_adam.yaml), and ovsim's
``gpt3-175b`` preset's vocabulary of 50,257, which Megatron-LM pads to a multiple of 512 at TP 4
(50,688: 0.9% more of a head that is 1% of the FLOPs).
"""

from __future__ import annotations

from dataclasses import dataclass

from ovsim.scenario import Scenario

SEQ = 2048


@dataclass(frozen=True)
class MlperfRow:
    """An MLPerf v3.1 GPT-3 run: its nodes, sequences a replica (MINIBS) and steady step time."""

    nodes: int
    minibs: int
    published_step_s: float
    tp: int = 4
    pp: int = 8
    virtual_stages: int = 12
    micro_batch: int = 1
    unit = "tok/s"

    @property
    def name(self) -> str:
        return f"mlperf31-gpt3-{self.gpus}"

    @property
    def gpus(self) -> int:
        return self.nodes * 8

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def micro_batches(self) -> int:
        return self.minibs // self.micro_batch

    @property
    def global_batch(self) -> int:
        return self.minibs * self.dp

    @property
    def published(self) -> float:
        """Tokens a second and GPU at the logged step time."""
        return self.throughput(self.published_step_s)

    def throughput(self, iteration_s: float) -> float:
        return self.global_batch * SEQ / iteration_s / self.gpus

    def scenario(self) -> Scenario:
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": self.name, "system": "hgx-h100-ndr", "nodes": self.nodes,
            "schedule": "overlapped",
            "training": {
                "model": "gpt3-175b", "micro_batch_size": self.micro_batch, "micro_batches": self.micro_batches,
                "precision": "fp8", "recompute": False,
                "parallel": {"tp": self.tp, "pp": self.pp, "dp": self.dp, "pipeline": "interleaved",
                             "virtual_stages": self.virtual_stages, "sequence_parallel": True,
                             "tp_overlap": "chunked", "distributed_optimizer": True, "overlap_param_gather": True},
            },
        })


# Nodes, MINIBS and the median of the last 20 logged steps (s) of each run's result_0.txt.
MLPERF_ROWS = [MlperfRow(n, b, t) for n, b, t in (
    (64, 128, 11.0457), (96, 128, 11.0767), (512, 16, 1.6083), (768, 16, 1.6156), (1024, 16, 1.6204),
    (1280, 8, 0.9252), (1344, 8, 0.9294))]
