"""bench/published_jobs.py on one small published row: the row line and its ``--breakdown``, whose
parts must add up as a timeline does (one compute stream: its kernels cannot take longer than the
iteration), and the published iteration the throughput implies."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_breakdown_of_a_published_row_adds_up(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import published_jobs as pj
        from published_rows import FOUNDRY_ROWS
    finally:
        sys.path.remove(str(ROOT / "bench"))
    row = next(r for r in FOUNDRY_ROWS if r.name == "mpt-7b-h100-8g-s2048")
    assert pj.main(["--rows", row.name, "--mode", "analytic", "--breakdown"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "rank 0:" in x)
    seconds = {k: float(v) for k, v in re.findall(r"(GEMMs|attention|memory-bound|them|busy|iteration|published) "
                                                 r"([0-9.]+) s", line)}
    assert set(seconds) == {"GEMMs", "attention", "memory-bound", "them", "busy", "iteration", "published"}
    kernels = seconds["GEMMs"] + seconds["attention"] + seconds["memory-bound"]
    assert 0 < seconds["GEMMs"] < kernels <= seconds["iteration"] * 1.0001
    assert seconds["busy"] > 0
    # FSDP's pre-divides run beside the compute stream, on the post-backward stream.
    assert 0 < seconds["them"] < seconds["memory-bound"]
    # The published iteration: the row's micro-batches of tokens at its published tokens a second.
    tokens = row.micro_batch * row.accum * row.seq
    assert seconds["published"] == pytest.approx(tokens / row.published_tokens_per_s, rel=2e-3)


def test_the_flashattention_rows_run_the_batches_their_table_gives() -> None:
    """Each row's micro-batch x count x 8 GPUs x 2,048 is the batch the table states (0.5M tokens for
    125M-760M, 1M for 1.3B and 2.7B: training/README.md), from the configs' own micro-batch and
    global batch; the model is the size its name says (parameters within 10%, tied embeddings)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from published_rows import FLASH_ROWS
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from ovsim.models.training_spec import layer_params

    stated_batch_tokens = {"125m": 2**19, "355m": 2**19, "760m": 2**19, "1.3b": 2**20, "2.7b": 2**20}
    stated_params = {"125m": 125e6, "355m": 355e6, "760m": 760e6, "1.3b": 1.3e9, "2.7b": 2.7e9}
    for row in FLASH_ROWS:
        assert row.micro_batch * row.micro_batches * row.gpus * row.seq == stated_batch_tokens[row.model]
        sc = row.scenario()
        assert sc.training is not None
        m = sc.training.model
        assert not isinstance(m, str)
        params = m.layers * layer_params(m, 1) + m.vocab * m.hidden + m.seq_len * m.hidden
        assert params == pytest.approx(stated_params[row.model], rel=0.1), row.name
        # Throughput per GPU at the published iteration is the table's node figure over 8.
        iteration_s = stated_batch_tokens[row.model] / row.published_tokens_per_s_node
        assert row.throughput(iteration_s) == pytest.approx(row.published_tokens_per_s_node / 8)


def _bench(name: str) -> object:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_the_sequence_sweep_split_recovers_the_factors_its_times_are_made_of() -> None:
    """Published times made as 1.25 x the non-attention work plus 2 x the attention at a priced
    efficiency of 0.6 give back 1.25 and an implied efficiency of 0.3, with no residual."""
    sweeps = _bench("attention_seq_sweeps")
    split, implied = sweeps.Split, sweeps.implied  # type: ignore[attr-defined]
    parts = ((2048, 1.0, 0.1), (8192, 1.1, 0.5), (32768, 1.2, 2.0))
    fit = implied([split(s, n + a, a, 1.25 * n + 2.0 * a, 0.6) for s, n, a in parts])
    assert fit.non_attention_factor == pytest.approx(1.25)
    assert fit.attention_efficiency == pytest.approx(0.3)
    assert max(map(abs, fit.residuals)) < 1e-9


def test_the_sequence_sweep_rows_are_the_models_and_batches_their_tables_give() -> None:
    """Each MPT model's parameters at 2,048 tokens within 0.5% of the tables' NumParams column, and
    each row's micro-batch x accumulation x 8 GPUs x sequence one of the tables' global batches."""
    from ovsim.models.training_spec import layer_params

    rows = _bench("published_rows").FOUNDRY_SEQ_SWEEPS  # type: ignore[attr-defined]
    num_params = {"125m": 125_311_488, "350m": 355_985_408, "760m": 760_470_528, "1b": 1_315_950_592,
                  "3b": 2_651_837_440}
    batches = {229_376, 327_680, 524_288, 786_432, 917_504, 983_040, 1_048_576, 1_179_648, 1_310_720}
    for row in rows:
        assert row.micro_batch * row.accum * 8 * row.seq in batches, row.name
        m = row.scenario().training.model
        if row.seq == 2048:
            n = m.layers * layer_params(m, 1) + m.vocab * m.hidden + m.seq_len * m.hidden
            assert n == pytest.approx(num_params[row.model], rel=5e-3), row.name


def test_the_megascale_rows_give_the_tables_mfu_and_tokens() -> None:
    """Each Megatron-LM row of MegaScale's table 2 (arXiv 2402.15627), built from its iteration
    time, gives the table's other columns: its MFU (model FLOPs of Korthikanti et al.'s equation 7
    over 312 TFLOP/s; the table rounds to 0.1 point, and three rows differ by up to 0.17) and its
    tokens a second, each within the table's rounding; table 3's baseline is its MFU. The model is
    a 175B."""
    ms = _bench("megascale_rows")
    table = {256: (53.0, 39.3e3), 512: (49.9, 74.1e3), 768: (46.7, 103.8e3), 1024: (44.7, 132.7e3),
             3072: (48.7, 433.6e3), 6144: (47.8, 851.6e3), 8192: (43.3, 1027.9e3), 12288: (41.2, 1466.8e3)}
    rows = ms.MEGASCALE_ROWS  # type: ignore[attr-defined]
    for row in rows[:-1]:
        mfu_pct, tokens_per_s = table[row.gpus]
        assert 100 * row.published / 312 == pytest.approx(mfu_pct, abs=0.2), row.name
        # Within half a percent: the times are printed to 0.1 s (0.4% of 11.9 s) or 0.01 s.
        assert row.global_batch * 2048 / row.published_iteration_s == pytest.approx(tokens_per_s, rel=5e-3), row.name
    baseline = rows[-1]
    assert (baseline.gpus, baseline.global_batch) == (256, 256)
    assert 100 * baseline.published / 312 == pytest.approx(47.7)
    sc = baseline.scenario()
    assert sc.training is not None and not isinstance(sc.training.model, str)
    from ovsim.models.training_spec import layer_params

    m = sc.training.model
    assert m.layers * layer_params(m, 1) + m.vocab * m.hidden == pytest.approx(175e9, rel=0.01)


def test_the_mlperf_rows_are_the_runs_their_files_name() -> None:
    """Each row's nodes and sequences a replica are its configuration file's name
    (config_DGXH100_<nodes>x8x<MINIBS>x4x8_mbs1.sh, mlcommons/training_results_v3.1; the 64-node
    run's is not published, its log gives the batch: 2,048 in 128 micro-batches), and its global
    batch the tokens its log's step counter advances a step over 2,048 (the helper's reading of
    each result_0.txt: 2,048 to 4,096 sequences)."""
    rows = _bench("mlperf_rows").MLPERF_ROWS  # type: ignore[attr-defined]
    files = {f"config_DGXH100_{r.nodes}x8x{r.minibs}x4x{r.pp}_mbs{r.micro_batch}.sh" for r in rows if r.nodes != 64}
    assert files == {"config_DGXH100_96x8x128x4x8_mbs1.sh", "config_DGXH100_512x8x16x4x8_mbs1.sh",
                     "config_DGXH100_768x8x16x4x8_mbs1.sh", "config_DGXH100_1024x8x16x4x8_mbs1.sh",
                     "config_DGXH100_1280x8x8x4x8_mbs1.sh", "config_DGXH100_1344x8x8x4x8_mbs1.sh"}
    batches = {r.gpus: r.global_batch for r in rows}
    assert batches == {512: 2048, 768: 3072, 4096: 2048, 6144: 3072, 8192: 4096, 10240: 2560, 10752: 2688}
    first = next(r for r in rows if r.nodes == 64)
    assert (first.dp, first.micro_batches) == (16, 128)


def test_the_fidelity_speed_bench_prints_figures_that_agree(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/fidelity_speed.py on a bundled example: each line's time after the build is its whole
    time less the build, and each ratio the quotient of the times it names (to the print's rounding)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import fidelity_speed
    finally:
        sys.path.remove(str(ROOT / "bench"))
    example = ROOT / "examples" / "training-gpt3-13b-pp4-1f1b-h100x4.yaml"
    assert fidelity_speed.main(["--rows", "--scenario", str(example), "--runs", "1"]) == 0
    line = capsys.readouterr().out.splitlines()[-1].split()
    assert line[0] == example.stem
    a, s, build, a_after, s_after = (float(x) for x in line[1:6])
    ratio, ratio_after = float(line[6].rstrip("x")), float(line[7].rstrip("x"))
    assert a_after == pytest.approx(a - build, abs=0.002) and s_after > 0
    assert ratio == pytest.approx(s / a, rel=0.05, abs=0.05)
    assert ratio_after == pytest.approx(s_after / a_after, rel=0.05, abs=0.05)
