"""Measured power logs (ovsim/traces/power.py) and power in the Perfetto export.

The log snippets follow the formats as printed by the tools: nvidia-smi's CSV as in NVIDIA's
"useful nvidia-smi queries" examples (header ``index, timestamp, power.draw [W], clocks.current.sm
[MHz]``, values ``208.36 W``), dcgmi dmon's text (``#Entity POWER SMCLK`` / ``ID W MHZ`` /
``GPU 0 ...``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ovsim.api import predict
from ovsim.errors import OvsimError
from ovsim.hw.power import FIT_COLUMNS
from ovsim.traces.perfetto import trace_events
from ovsim.traces.power import (
    SAMPLE_COLUMNS,
    align_samples,
    fit_table,
    offset_from_wall_clock,
    predicted_at,
    read_power_samples,
)

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "gemm-allreduce-a100x4-priority.yaml"

SMI_UNITS = """\
index, timestamp, power.draw [W], clocks.current.sm [MHz]
0, 2024/05/01 12:00:00.000, 61.50 W, 1410 MHz
1, 2024/05/01 12:00:00.004, 62.25 W, 1410 MHz
0, 2024/05/01 12:00:00.100, 398.10 W, 1275 MHz
1, 2024/05/01 12:00:00.104, [N/A], 1260 MHz
"""

SMI_NOUNITS = """\
timestamp, power.draw [W], clocks.sm [MHz], pci.bus_id
2024/05/01 12:00:00.000, 61.50, 1410, 00000000:07:00.0
2024/05/01 12:00:00.000, 70.00, 1410, 00000000:0F:00.0
2024/05/01 12:00:00.250, 300.00, 1300, 00000000:07:00.0
2024/05/01 12:00:00.250, 310.00, 1290, 00000000:0F:00.0
"""

DMON = """\
#Entity   POWER    SMCLK
ID        W        MHZ
GPU 0     61.250   1410
GPU 1     60.100   1410
GPU-I 3   N/A      N/A
GPU 0     395.500  1275
GPU 1     390.000  1290
#Entity   POWER    SMCLK
ID        W        MHZ
GPU 0     120.000  1410
GPU 1     N/A      1410
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- nvidia-smi ------------------------------------------------------------------------------------


def test_nvidia_smi_with_units(tmp_path: Path) -> None:
    df = read_power_samples(write(tmp_path, "smi.csv", SMI_UNITS))
    assert list(df.columns) == SAMPLE_COLUMNS
    assert df["gpu"].tolist() == [0, 1, 0, 1]
    assert df["time_s"].to_numpy() == pytest.approx([0.0, 0.004, 0.1, 0.104])
    assert df["power_w"].iloc[2] == 398.10 and np.isnan(df["power_w"].iloc[3])
    assert df["sm_clock_hz"].iloc[2] == pytest.approx(1.275e9)
    assert np.isfinite(df["wall_time_s"]).all()


def test_nvidia_smi_without_units_numbers_gpus_by_bus_id(tmp_path: Path) -> None:
    df = read_power_samples(write(tmp_path, "smi.csv", SMI_NOUNITS))
    assert df["gpu"].tolist() == [0, 1, 0, 1]
    assert df["power_w"].tolist() == [61.5, 70.0, 300.0, 310.0]
    assert df["time_s"].tolist() == pytest.approx([0.0, 0.0, 0.25, 0.25])


def test_nvidia_smi_without_timestamps_uses_the_interval(tmp_path: Path) -> None:
    text = "power.draw.instant [W]\n100.0 W\n200.0 W\n300.0 W\n"
    df = read_power_samples(write(tmp_path, "p.csv", text), interval_s=0.1)
    assert df["time_s"].tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert df["gpu"].tolist() == [0, 0, 0] and df["sm_clock_hz"].isna().all()


def test_a_truncated_last_line_is_dropped_and_counted(tmp_path: Path) -> None:
    df = read_power_samples(write(tmp_path, "smi.csv", SMI_UNITS + "0, 2024/05/01 12:00:00.200, 3"))
    assert len(df) == 4 and df.attrs["skipped"] == {"truncated last line": 1}


def test_a_repeated_header_is_skipped(tmp_path: Path) -> None:
    header = SMI_UNITS.splitlines()[0]
    df = read_power_samples(write(tmp_path, "smi.csv", SMI_UNITS + header + "\n0, 2024/05/01 12:00:01.000, 90 W, "
                                  "1410 MHz\n"))
    assert len(df) == 5


@pytest.mark.parametrize(("text", "field", "words"), [
    ("index, timestamp, power.draw [W]\n0, 2024/05/01 12:00:00.000, 61.5 W, 3\n0, 2024/05/01 12:00:01.000, 1 W\n",
     "csv", "line 2"),
    ("index, timestamp, power.draw [W]\n0, 2024/05/01 12:00:00.000, sixty W\n", "power.draw", "line 2"),
    ("index, timestamp, power.draw [W]\n0, yesterday, 61 W\n", "timestamp", "line 2"),
    ("index, timestamp, power.draw [W]\n0, 2024/05/01 12:00:00.000, 61 V\n", "power.draw", "unit"),
    ("index, power.draw [W]\nzero, 61 W\n", "index", "GPU index"),
    ("0, 2024/05/01 12:00:00.000, 61.50 W\n", "format", "power log"),
    ("index, power.draw [W]\n0, [N/A]\n", "power", "missing"),
    ("index, timestamp, power.draw [W]\n0, 2024/05/01 12:00:00.000, 1e400 W\n", "power.draw", "not a finite"),
    ("index, timestamp, power.draw [W]\n0, 2024/05/01 12:00:00.000, -61 W\n", "power", "negative value (-61 W"),
    ("index, timestamp, power.draw [W], clocks.sm [MHz]\n0, 2024/05/01 12:00:00.000, 61 W, -1410 MHz\n",
     "sm_clock", "negative value (-1.41e+09 Hz in 1 sample(s))"),
    # DCGM CSV: a time past what nanoseconds since 1970 hold, a power that overflows a float.
    ("timestamp,gpu,DCGM_FI_DEV_POWER_USAGE\n1e300,0,61\n", "timestamp", "line 2: '1e300' is not a time"),
    ("timestamp,gpu,DCGM_FI_DEV_POWER_USAGE\n1714564800,0,1e400\n", "DCGM_FI_DEV_POWER_USAGE", "not a finite"),
])
def test_bad_power_log_is_one_line_naming_file_and_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    p = write(tmp_path, "bad.csv", text)
    with pytest.raises(OvsimError) as err:
        read_power_samples(p)
    e = err.value
    assert e.source == str(p) and e.field == field and words in e.message
    assert "\n" not in e.one_line()


def test_power_column_named_in_the_error_when_absent(tmp_path: Path) -> None:
    p = write(tmp_path, "p.csv", "index, power.limit [W]\n0, 400 W\n")
    with pytest.raises(OvsimError) as err:
        read_power_samples(p, "nvidia-smi")
    assert err.value.field == "power.draw" and "power.limit" in err.value.message


def test_a_gzip_compressed_log_reads_as_its_text_whatever_its_name(tmp_path: Path) -> None:
    plain = read_power_samples(write(tmp_path, "smi.csv", SMI_UNITS))
    packed = tmp_path / "smi.log"
    packed.write_bytes(gzip.compress(SMI_UNITS.encode()))
    pd.testing.assert_frame_equal(read_power_samples(packed), plain)


def test_a_broken_gzip_log_is_one_line_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "smi.csv.gz"
    broken.write_bytes(gzip.compress(SMI_UNITS.encode())[:30])
    with pytest.raises(OvsimError, match=r"smi\.csv\.gz.*cannot be decompressed"):
        read_power_samples(broken)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OvsimError, match="file not found"):
        read_power_samples(tmp_path / "nope.csv")


# -- dcgmi dmon ------------------------------------------------------------------------------------


def test_dcgmi_dmon_spaces_samples_by_the_delay_and_skips_instances(tmp_path: Path) -> None:
    df = read_power_samples(write(tmp_path, "dmon.txt", DMON), interval_s=0.1)
    g0 = df[df["gpu"] == 0]
    assert g0["time_s"].tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert g0["power_w"].tolist() == [61.25, 395.5, 120.0]
    assert df[df["gpu"] == 1]["power_w"].isna().sum() == 1
    assert df["sm_clock_hz"].max() == pytest.approx(1.41e9)
    assert df.attrs["skipped"] == {"GPU-I rows": 1}
    assert df["wall_time_s"].isna().all()


def test_dcgmi_dmon_with_epoch_prefixes_uses_them(tmp_path: Path) -> None:
    text = ("1714564800.000 #Entity   POWER\n1714564800.000 ID        W\n"
            "1714564800.000 GPU 0     61.0\n1714564800.050 GPU 0     300.0\n1714564800.125 GPU 0     310.0\n")
    df = read_power_samples(write(tmp_path, "dmon.txt", text))
    assert df["time_s"].tolist() == pytest.approx([0.0, 0.05, 0.125])
    assert df["wall_time_s"].iloc[0] == pytest.approx(1714564800.0)


def test_dcgmi_dmon_without_power_field_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "dmon.txt", "#Entity   SMCLK\nID MHZ\nGPU 0     1410\n")
    with pytest.raises(OvsimError) as err:
        read_power_samples(p)
    assert err.value.field == "POWER" and err.value.source == str(p)


def test_dcgmi_dmon_short_row_mid_file_is_an_error(tmp_path: Path) -> None:
    p = write(tmp_path, "dmon.txt", "#Entity POWER SMCLK\nGPU 0 61.0\nGPU 0 62.0 1410\n")
    with pytest.raises(OvsimError) as err:
        read_power_samples(p)
    assert err.value.field == "dmon" and "line 2" in err.value.message


# -- DCGM field CSV ---------------------------------------------------------------------------------


def test_dcgm_field_csv_with_epoch_milliseconds_and_iso_times(tmp_path: Path) -> None:
    ms = ("timestamp,gpu,DCGM_FI_DEV_POWER_USAGE,DCGM_FI_DEV_SM_CLOCK\n"
          "1714564800000,0,61.0,1410\n1714564800100,0,390.5,1275\n1714564800100,1,380.0,1290\n")
    df = read_power_samples(write(tmp_path, "d.csv", ms))
    assert df["time_s"].tolist() == pytest.approx([0.0, 0.1, 0.1])
    assert df["sm_clock_hz"].iloc[1] == pytest.approx(1.275e9)
    iso = "time,entityId,DCGM_FI_DEV_POWER_USAGE\n2024-05-01T12:00:00Z,0,61\n2024-05-01T12:00:00.5Z,0,300\n"
    df2 = read_power_samples(write(tmp_path, "i.csv", iso))
    assert df2["time_s"].tolist() == pytest.approx([0.0, 0.5]) and df2["sm_clock_hz"].isna().all()


def test_dcgm_field_csv_needs_a_time_column(tmp_path: Path) -> None:
    p = write(tmp_path, "d.csv", "gpu,DCGM_FI_DEV_POWER_USAGE\n0,61\n")
    with pytest.raises(OvsimError) as err:
        read_power_samples(p)
    assert err.value.field == "timestamp"


# -- alignment ---------------------------------------------------------------------------------------


def test_alignment_shifts_maps_and_clips(tmp_path: Path) -> None:
    df = read_power_samples(write(tmp_path, "smi.csv", SMI_UNITS))
    out = align_samples(df, offset_s=-0.05, start_s=0.0, gpu_to_rank={0: 3})
    assert out["rank"].tolist() == [3] and out["time_s"].tolist() == pytest.approx([0.05])
    wall0 = float(df["wall_time_s"].iloc[0])
    assert offset_from_wall_clock(df, wall0 - 2.0) == pytest.approx(2.0)


def test_predicted_at_reads_piecewise_constant_counters_and_window_means() -> None:
    counters = pd.DataFrame({"time_s": [0.0, 1.0, 1.0, 3.0], "rank": [0, 0, 0, 0],
                             "counter": ["power_w"] * 4, "value": [100.0, 999.0, 200.0, 50.0]})
    samples = pd.DataFrame({"time_s": [0.5, 1.0, 2.0, 3.5], "rank": [0, 0, 0, 0]})
    # Of the two samples at t = 1 the later holds.
    assert predicted_at(samples, counters).tolist() == [100.0, 200.0, 200.0, 50.0]
    mean = predicted_at(samples, counters, window_s=1.0)
    # Windows ending at 0.5 reach before the first sample: unknown.
    assert np.isnan(mean[0])
    assert mean[1:].tolist() == pytest.approx([100.0, 200.0, 125.0])


# -- with a prediction --------------------------------------------------------------------------------


def test_fit_table_lines_up_measured_power_with_predicted_activity() -> None:
    r = predict(EXAMPLE)
    t = np.linspace(0.0, r.timeline.makespan_s * 0.99, 40)
    samples = pd.DataFrame({"time_s": np.tile(t, 2), "gpu": np.repeat([0, 1], len(t)), "power_w": 200.0,
                            "sm_clock_hz": np.nan, "wall_time_s": np.nan})
    table = fit_table(align_samples(samples), r.timeline.counters)
    assert list(table.columns) == list(FIT_COLUMNS) and len(table) == 80
    assert table["sm_tensor_fraction"].max() > 0.5 and table["sm_memory_fraction"].max() > 0
    assert table["hbm_bytes_per_s"].max() > 0 and table["link_bytes_per_s"].max() > 0
    assert (table["sm_clock_hz"] > 0).all()


def test_perfetto_trace_has_power_and_clock_tracks() -> None:
    r = predict(EXAMPLE, power_cap_w=250.0)
    events = trace_events(r.timeline)["traceEvents"]
    json.dumps(events)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"power_w", "sm_clock_hz"} <= counters
    power = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == "power_w"]
    assert max(power) > r.gpu.power.idle_w
