"""The published overlap studies' setups (ovsim.studies) and their rows in ovsim validate."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from ovsim import studies, validate
from ovsim.api import predict
from ovsim.cli import main
from ovsim.errors import OvsimError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("system", studies.CUI_SYSTEMS)
def test_cui_pericas_scenarios_are_the_bundled_examples(system: str) -> None:
    """The study's schedules as built here and as the example files spell them give one iteration."""
    files = {"naive overlap": "overlapped", "priority": "priority", "priority + shaping": "shaped",
             "sequential": "sequential"}
    for schedule, stem in files.items():
        built = predict(studies.cui_pericas_scenario(system, schedule), counters=False).summary()["makespan_s"]
        shipped = predict(EXAMPLES / f"gemm-allreduce-{system}-{stem}.yaml", counters=False).summary()["makespan_s"]
        assert built == pytest.approx(shipped, rel=1e-12), schedule
    with pytest.raises(OvsimError, match="schedule"):
        studies.cui_pericas_scenario(system, "shaped only")


def test_the_pipeline_splits_the_global_batch_into_eight_micro_batches() -> None:
    assert studies.lee_training("gpt3-1.3b", "pp", 32)["micro_batch_size"] == 4
    assert studies.lee_training("gpt3-1.3b", "pp", 8)["micro_batches"] == 8
    assert studies.lee_training("gpt3-1.3b", "fsdp", 32)["micro_batch_size"] == 32
    assert "layers" not in studies.lee_training("gpt3-1.3b", "fsdp", 8)


@pytest.mark.slow
def test_matrix_rows_in_processes_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(studies, "LEE_MODELS", ("gpt3-1.3b",))
    seen: list[dict[str, Any]] = []
    one = studies.lee_matrix(4, (8,), on_row=seen.append)
    two = studies.lee_matrix(4, (8,), workers=2)
    assert len(one) == 4 and seen == one.to_dict("records")
    assert two.equals(one)
    # FSDP overlaps its all-gathers with compute: some communication is hidden and compute slows.
    fsdp = one[one["parallel"] == "fsdp"]
    assert (fsdp["comm_hidden_pct"] > 0).all() and (fsdp["compute_slowdown_pct"] >= 0).all()
    # Memory is the configuration's at the model's own depth, not at the 4 layers simulated.
    from ovsim.models.memory import memory_estimate
    from ovsim.models.training_spec import TrainingSpec

    full = memory_estimate(TrainingSpec.model_validate(studies.lee_training("gpt3-1.3b", "fsdp", 8)), 4)
    assert fsdp["memory_per_gpu_gb"].tolist() == pytest.approx([full.total_bytes / 1e9] * 2)
    with pytest.raises(OvsimError, match="workers"):
        studies.lee_matrix(2, (8,), workers=-1)


def test_a_band_check_passes_inside_its_interval_only() -> None:
    def band(x: float) -> validate.Check:
        return validate.Check("c", "g", 18.9, x, "%", 0.0, "s", rule="band", low=15.0, high=23.0)

    assert band(15.0).passed and band(23.0).passed and band(18.0).passed
    assert not band(14.9).passed and not band(23.1).passed and not band(math.nan).passed


@pytest.mark.slow
def test_validate_studies_reports_each_published_figure(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--studies adds the studies' rows (here over a reduced matrix, so the figures are not the
    published comparison), each with its target band; without it the table says they were not run."""
    full = studies.lee_matrix
    monkeypatch.setattr(studies, "LEE_MODELS", ("gpt3-1.3b",))
    monkeypatch.setattr(studies, "lee_matrix", lambda layers, workers=1, **kw: full(4, (8,), workers=workers, **kw))
    rc = main(["validate", "--studies", "--json"])
    doc = json.loads(capsys.readouterr().out)
    # The reduced matrix misses its bands: the status says a check failed.
    assert rc == (0 if doc["passed"] == doc["total"] else 1)
    rows = [c for c in doc["checks"] if c["group"] == validate.STUDY]
    assert [(c["reference"], c["low"], c["high"]) for c in rows] == [
        (18.9, 15.0, 23.0), (40.0, 32.0, 48.0), (10.2, 6.0, 14.0), (25.5, 15.0, 30.0), (25.5, 15.0, 30.0)]
    assert all(c["rule"] == "band" and math.isfinite(c["predicted"]) for c in rows)
    rc = main(["validate"])
    out = capsys.readouterr().out
    assert "(no --studies: the overlap studies' configurations not run)" in out
    passed, total = (int(x) for x in re.search(r"(\d+) of (\d+) checks pass", out).groups())  # type: ignore[union-attr]
    assert rc == (0 if passed == total else 1)


def test_the_fits_reading_takes_the_largest_micro_batch_that_fits() -> None:
    """GPT-3 1.3B, FSDP, batch 8 per GPU: one micro-batch of 8 needs about 36 GB by the estimate,
    more than 0.9 of a 40 GB A100, so it runs as 2 micro-batches of 4; on an 80 GB H100 as one of
    8. GPT-3 13B's model states alone, 16 bytes a parameter over 4 GPUs (52 GB), fit no A100 40 GB."""
    from ovsim.hw.spec import load_gpu
    from ovsim.models.memory import USABLE_FRACTION, memory_estimate
    from ovsim.models.training_spec import TrainingSpec

    a100 = studies.lee_training("gpt3-1.3b", "fsdp", 8, reading="fits", system="a100x4")
    h100 = studies.lee_training("gpt3-1.3b", "fsdp", 8, reading="fits", system="h100x4")
    assert a100 is not None and (a100["micro_batch_size"], a100["micro_batches"], a100["recompute"]) == (4, 2, False)
    assert h100 is not None and (h100["micro_batch_size"], h100["micro_batches"]) == (8, 1)
    budget = USABLE_FRACTION * load_gpu("a100-sxm4-40gb").memory.capacity_bytes
    bigger = TrainingSpec.model_validate({**a100, "micro_batch_size": 8, "micro_batches": 1})
    assert memory_estimate(bigger, 4).total_bytes > budget >= memory_estimate(TrainingSpec.model_validate(a100),
                                                                              4).total_bytes
    assert studies.lee_training("gpt3-13b", "fsdp", 8, reading="fits", system="a100x4") is None
    with pytest.raises(OvsimError, match="reading"):
        studies.lee_training("gpt3-1.3b", "fsdp", 8, reading="per token")
    with pytest.raises(OvsimError, match="layout 'ddp'"):
        studies.lee_training("gpt3-1.3b", "ddp", 8)


def test_a_configuration_that_fits_nowhere_is_counted_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(studies, "LEE_MODELS", ("gpt3-13b",))
    monkeypatch.setattr(studies, "LEE_SYSTEMS", ("a100x4",))
    df = studies.lee_matrix(4, (8,), reading="fits")
    assert len(df) == 2 and df["compute_slowdown_pct"].isna().all() and not df["fits_memory"].any()
