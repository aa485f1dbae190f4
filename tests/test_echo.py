"""The Echo-slowdown validation group (ovsim.validate.echo)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from shared_traces import TRACES, real

from ovsim.errors import OvsimError
from ovsim.replay import replay
from ovsim.validate import echo
from ovsim.validate.echo import ECHO_GROUP, echo_checks

HEADER = "id,kShortName,kDemangledName,ground_truth,duration,overlap_ratio\n"


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "merged_features.csv"
    p.write_text(HEADER + "".join(r + "\n" for r in rows))
    return p


def test_score_by_hand() -> None:
    # Errors +2%, -8%, +20%: one within 5%, two within 10%; summed (1.02 + 0.92 + 1.2) / 3 - 1.
    s = echo.score(np.array([1.02, 0.92, 1.2]), np.ones(3))
    assert s.kernels == 3
    assert s.within_5_pct == pytest.approx(100 / 3)
    assert s.within_10_pct == pytest.approx(200 / 3)
    assert s.mape_pct == pytest.approx((2 + 8 + 20) / 3)
    assert s.summed_pct == pytest.approx((3.14 / 3 - 1) * 100)


def test_each_kernel_keeps_its_own_single_gpu_time(tmp_path: Path) -> None:
    # Two kernels of one name and different sizes: each must be predicted from its own single-GPU
    # duration, not a median of both. Rows without overlap are not scored.
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, float*)"
    p = _csv(tmp_path, [f'1,add,"{name}",10000,12000,1.0', f'2,add,"{name}",50000,51000,0.5',
                        f'3,add,"{name}",7000,7000,0.0'])
    rows = echo.load_echo(p)
    assert rows["id"].tolist() == [1, 2]
    bundle, scored = echo.echo_bundle(rows)
    k = replay(bundle, gpu=echo.ECHO_GPU, counters=False).kernels  # type: ignore[arg-type]
    assert (k["isolated_source"].to_numpy()[scored] == "signature").all()
    np.testing.assert_allclose(k["isolated_s"].to_numpy()[scored], [10e-6, 50e-6], rtol=1e-12)
    assert k["overlapped"].to_numpy()[scored].all()
    # Beside the all-reduce a kernel is never faster than alone.
    _, pred = echo.predict(p)
    assert (pred >= np.array([10e-6, 50e-6]) * (1 - 1e-9)).all()


@pytest.mark.parametrize(("row", "field"), [
    ('1,a,"k",-5,10,0.5', "ground_truth/duration/overlap_ratio"),
    ('1,a,"k",5,10,1.5', "ground_truth/duration/overlap_ratio"),
    ('1,a,"k",five,10,0.5', "ground_truth/duration/overlap_ratio"),
])
def test_bad_rows_are_refused_with_the_line(tmp_path: Path, row: str, field: str) -> None:
    with pytest.raises(OvsimError) as e:
        echo.load_echo(_csv(tmp_path, [row]))
    assert e.value.field == field
    assert "line 2" in str(e.value)


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_text("id,kDemangledName,ground_truth,duration\n1,k,5,6\n")
    with pytest.raises(OvsimError) as e:
        echo.load_echo(p)
    assert e.value.field == "overlap_ratio"


def test_no_echo_file_no_rows(tmp_path: Path) -> None:
    assert echo_checks(tmp_path) == []


def test_echo_group_on_the_real_file() -> None:
    path = real(echo.ECHO_FILE)
    checks = echo_checks(TRACES)
    assert [c.group for c in checks] == [ECHO_GROUP] * 2
    # The data set's README: 404 of its 619 rows overlapped an NCCL kernel.
    assert all("404 overlapped kernels" in c.name for c in checks)
    raw = pd.read_csv(path)
    over = raw[raw["overlap_ratio"] > 0]
    naive = echo.score(over["ground_truth"].to_numpy(float), over["duration"].to_numpy(float))
    # Summed single-GPU time against summed 2-GPU time of the overlapped kernels, from the file.
    assert f"naive {naive.summed_pct:+.1f}%" in checks[1].note
