"""Write the schedule-search benchmark set: scenarios and the knobs searched on each.

    python bench/tune_cases/make_cases.py      # rewrites bench/tune_cases/*.yaml and cases.yaml

Families (each a real shape; sources in the scenarios' descriptions):
- ``ficco``: FiCCO-like tensor-parallel layers (arXiv 2512.10236): every all-gather + GEMM and
  GEMM + reduce-scatter of a transformer layer, run as is, split into pieces on SMs (collective
  matmul) or on copy engines, on one node of 8 H100 or 8 A100.
- ``tpgemm``: one tensor-parallel GEMM of a real model beside an independent all-gather or
  reduce-scatter of its activations (the overlap FiCCO's finer-grain schedules make), on 8 GPUs.
- ``cui``: Cui & Pericas's GEMM beside an all-reduce (arXiv 2606.09200) on 4x A100 and 4x H100,
  three sizes each.
- ``ddp``, ``fsdp``: data-parallel training iterations of GPT-3 models on 8x A100 and 8x H100.
- ``nodes``: several HGX H100 nodes joined by InfiniBand (tensor parallel inside, data parallel
  across).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
MIB = 2**20
# Llama 3 8B's shape (Meta's released config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
# FFN 14336, vocabulary 128256, SwiGLU, untied embeddings).
LLAMA3_8B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "vocab": 128256,
             "seq_len": 8192, "gated_mlp": True, "tied_embeddings": False,
             "source": "Meta Llama 3 8B config.json"}
# (name, hidden, FFN) of the models whose tensor-parallel GEMMs the tpgemm family takes.
SHAPES = (("llama3-8b", 4096, 14336), ("llama2-70b", 8192, 28672), ("gpt3-175b", 12288, 49152))

SPACES: dict[str, dict[str, list[Any]]] = {
    "ficco": {"training.parallel.tp_overlap": ["none", "chunked", "copy_engine"],
              "training.parallel.tp_chunks": [None, 2, 4, 8], "knobs.comm_priority": ["normal", "high"],
              "knobs.nccl_channels": [None, 8]},
    "tpgemm": {"schedule": ["overlapped", "sequential"], "knobs.comm_priority": ["normal", "high"],
               "knobs.nccl_channels": [None, 4, 16], "knobs.sm_carveout": [0, 16]},
    "tpgemm_ag": {"schedule": ["overlapped", "sequential"], "knobs.comm_priority": ["normal", "high"],
                  "knobs.nccl_channels": [None, 4, 16], "knobs.sm_carveout": [0, 16],
                  "knobs.ce_offload": [False, True]},
    "cui": {"knobs.comm_priority": ["normal", "high"], "knobs.occupancy_shaping_smem_bytes": [0, 32768, 65536],
            "knobs.sm_carveout": [0, 8, 16, 32], "knobs.nccl_channels": [None, 8]},
    "ddp": {"training.parallel.bucket_bytes": [MIB, 5 * MIB, 25 * MIB, 100 * MIB],
            "knobs.comm_priority": ["normal", "high"], "knobs.nccl_channels": [None, 8, 16]},
    "fsdp": {"training.parallel.fsdp_prefetch": [0, 1, 2], "knobs.ce_offload": [False, True],
             "knobs.comm_priority": ["normal", "high"], "knobs.nccl_channels": [None, 8]},
    "nodes": {"training.parallel.bucket_bytes": [5 * MIB, 25 * MIB, 100 * MIB],
              "training.parallel.tp_overlap": ["none", "chunked"], "knobs.comm_priority": ["normal", "high"]},
}


def _scenario(name: str, description: str, system: str, **rest: Any) -> dict[str, Any]:
    return {"schema": "ovsim.scenario/1", "name": name, "description": description, "system": system,
            "schedule": "overlapped", **rest}


def ficco() -> list[tuple[dict[str, Any], str]]:
    out = []
    models: list[tuple[str, Any]] = [("llama3-8b", LLAMA3_8B), ("llama2-13b", "llama2-13b"),
                                     ("llama2-70b", "llama2-70b"), ("gpt3-175b", "gpt3-175b")]
    for gpu, system in (("h100", "hgx-h100"), ("a100", "dgx-a100-80gb")):
        for label, model in models:
            for mbs in (1, 2):
                out.append((_scenario(
                    f"ficco-{label}-tp8-mbs{mbs}-{gpu}",
                    f"Two layers of {label} with 8-way tensor and sequence parallelism, micro-batch {mbs}: each "
                    "all-gather + GEMM and GEMM + reduce-scatter as is, chunked or on copy engines (FiCCO, "
                    "arXiv 2512.10236).", system,
                    training={"model": model, "layers": 2, "micro_batch_size": mbs, "precision": "bf16",
                              "optimizer": False, "embedding_and_head": False,
                              "parallel": {"tp": 8, "sequence_parallel": True}}), "ficco"))
    return out


def tpgemm() -> list[tuple[dict[str, Any], str]]:
    out = []
    for gpu, system in (("h100", "hgx-h100"), ("a100", "dgx-a100-80gb")):
        for label, hidden, ffn in SHAPES:
            for tokens in (4096, 16384):
                act = tokens * hidden * 2
                for coll in ("all_gather", "reduce_scatter"):
                    # Column-parallel FC1 after the all-gather (K = hidden, N = ffn / 8); row-parallel
                    # FC2 before the reduce-scatter (K = ffn / 8, N = hidden).
                    m, n, k = (tokens, ffn // 8, hidden) if coll == "all_gather" else (tokens, hidden, ffn // 8)
                    out.append((_scenario(
                        f"tpgemm-{label}-{tokens}-{coll.replace('_', '')}-{gpu}",
                        f"{label}'s tensor-parallel {'FC1' if coll == 'all_gather' else 'FC2'} GEMM ({m}x{n}x{k}, "
                        f"BF16) of {tokens} tokens beside an independent {coll} of the activations "
                        f"({act / 1e6:.0f} MB) on 8 GPUs.", system,
                        ops=[{"name": "gemm", "kind": "gemm", "m": m, "n": n, "k": k, "precision": "bf16"},
                             {"name": coll, "kind": coll, "size_bytes": float(act), "stream": "comm"}]),
                        "tpgemm_ag" if coll == "all_gather" else "tpgemm"))
    return out


def cui() -> list[tuple[dict[str, Any], str]]:
    out = []
    for gpu, system in (("h100", "h100x4"), ("a100", "a100x4")):
        for size in (4096, 8192, 16384):
            out.append((_scenario(
                f"cui-gemm{size}-allreduce-{gpu}",
                f"GEMM {size}^3 (FP16, 64x64x32 tiles as in Cui & Pericas, arXiv 2606.09200) beside an "
                f"all-reduce of {896 * (size / 8192) ** 2:.0f} MB (the study's 896 MB at 8192^3, scaled with the "
                "GEMM's output) on 4 GPUs.", system,
                ops=[{"name": "gemm", "kind": "gemm", "m": size, "n": size, "k": size, "precision": "fp16",
                      "tile": [64, 64, 32], "threads": 128, "registers_per_thread": 96, "stages": 3},
                     {"name": "allreduce", "kind": "all_reduce",
                      "size_bytes": 896e6 * (size / 8192) ** 2, "stream": "comm"}]), "cui"))
    return out


def data_parallel() -> list[tuple[dict[str, Any], str]]:
    """DDP where a replica's weights, gradients and Adam state fit one GPU (16 bytes a parameter:
    not GPT-3 6.7B), FSDP up to 6.7B; 8x A100 80 GB and 8x H100."""
    out = []
    for system, label in (("dgx-a100-80gb", "a100x8"), ("hgx-h100", "h100x8")):
        for model, mbs in (("gpt3-1.3b", 4), ("gpt3-1.3b", 8), ("gpt3-2.7b", 4)):
            out.append((_scenario(
                f"ddp-{model}-mbs{mbs}-{label}", f"One DDP iteration of {model}, micro-batch {mbs} of 2048 tokens, "
                "BF16.", system,
                training={"model": model, "micro_batch_size": mbs, "precision": "bf16",
                          "parallel": {"dp_mode": "ddp"}}), "ddp"))
        for model in ("gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b"):
            out.append((_scenario(
                f"fsdp-{model}-{label}",
                f"One FSDP (ZeRO-3) iteration of {model}, micro-batch 4 of 2048 tokens, BF16.", system,
                training={"model": model, "micro_batch_size": 4, "precision": "bf16",
                          "parallel": {"dp_mode": "fsdp"}}), "fsdp"))
    return out


def nodes() -> list[tuple[dict[str, Any], str]]:
    out = []
    for n in (2, 4):
        out.append((_scenario(
            f"nodes-llama2-70b-tp8-dp{n}-h100",
            f"Four of LLaMA2-70B's layers on {n} HGX H100 nodes (8x 400 Gb/s InfiniBand each): 8-way tensor "
            f"and sequence parallelism inside a node, {n}-way DDP across nodes, one 4096-token sequence per GPU.",
            "hgx-h100-ndr", nodes=n,
            training={"model": "llama2-70b", "layers": 4, "micro_batch_size": 1, "precision": "bf16",
                      "embedding_and_head": False,
                      "parallel": {"tp": 8, "sequence_parallel": True, "dp_mode": "ddp"}}), "nodes"))
    return out


def main() -> None:
    cases = ficco() + tpgemm() + cui() + data_parallel() + nodes()
    for old in HERE.glob("*.yaml"):
        old.unlink()
    for data, _ in cases:
        (HERE / f"{data['name']}.yaml").write_text(yaml.safe_dump(data, sort_keys=False, width=100))
    manifest = {"spaces": SPACES, "cases": {f"{d['name']}.yaml": space for d, space in cases}}
    (HERE / "cases.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False, width=100))
    print(f"{len(cases)} cases written to {HERE}")


if __name__ == "__main__":
    main()
