"""The fuzzing campaign (tests/fuzz_support.py says what a case is and which properties hold).

Hypothesis draws mutations of the bundled example scenarios and of the bundled trace: a few hundred
cases in the default run, 10,000 in the ``slow`` run. Cases are drawn deterministically
(``derandomize``), so a run is reproducible. A case that breaks a property is printed with what was
mutated; keep it with ``fuzz_support.save_to_corpus`` once fixed, and the corpus test below replays
it in every run.
"""

from __future__ import annotations

from pathlib import Path

import fuzz_support as fz
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

SCENARIOS = fz.base_scenarios()
TRACE = fz.base_trace()
SCENARIO_KINDS = ("unknown_key", "odd_number", "bad_enum", "negative", "duplicate_op", "scale", "null", "delete")
TRACE_KINDS = ("truncate_gzip", "flip_gzip", "truncate_json", "delete_field", "odd_field")
# Cases are about input, not scale: a small op limit keeps each one short.
MAX_OPS = ["--max-ops", "5000"]
# No shrinking: a case already says what was mutated, and shrinking a slow case takes long.
_PHASES = (Phase.explicit, Phase.generate)
FAST = settings(max_examples=150, deadline=None, derandomize=True, database=None, phases=_PHASES,
                suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=5000, deadline=None, derandomize=True, database=None, phases=_PHASES,
                suppress_health_check=[HealthCheck.too_slow])

_index = st.integers(min_value=0, max_value=10**6)


@st.composite
def scenario_cases(draw: st.DrawFn) -> fz.Case:
    name, doc = SCENARIOS[draw(st.integers(0, len(SCENARIOS) - 1))]
    if draw(st.integers(0, 7)) == 0:
        case = fz.text_case(doc, draw(_index), draw(_index), draw(st.integers(0, 255)))
    else:
        mutated, invalid, why = fz.mutate_scenario(doc, draw(st.sampled_from(SCENARIO_KINDS)), draw(_index),
                                                   draw(_index))
        case = fz.scenario_case(mutated, invalid, f"{name}: {why}", draw(st.integers(0, 2)))
    case.args = [*case.args, *MAX_OPS]
    return case


@st.composite
def trace_cases(draw: st.DrawFn) -> fz.Case:
    return fz.trace_case(TRACE, draw(st.sampled_from(TRACE_KINDS)), draw(_index), draw(_index),
                         draw(st.sampled_from(("replay", "import"))))


def _check(case: fz.Case) -> None:
    broken = fz.violations(case, fz.run_case(case))
    assert not broken, f"{case.command} {case.file_name} ({case.why}): {broken}"


@FAST
@given(scenario_cases())
def test_mutated_scenarios_keep_the_properties(case: fz.Case) -> None:
    _check(case)


@FAST
@given(trace_cases())
def test_mutated_traces_keep_the_properties(case: fz.Case) -> None:
    _check(case)


@pytest.mark.slow
@SLOW
@given(scenario_cases())
def test_many_mutated_scenarios_keep_the_properties(case: fz.Case) -> None:
    _check(case)


@pytest.mark.slow
@SLOW
@given(trace_cases())
def test_many_mutated_traces_keep_the_properties(case: fz.Case) -> None:
    _check(case)


@pytest.mark.parametrize(("name", "case"), fz.corpus_cases(), ids=[n for n, _ in fz.corpus_cases()])
def test_the_corpus_of_failures_found_stays_fixed(name: str, case: fz.Case) -> None:
    _check(case)


def test_an_invalid_case_that_ran_would_be_caught() -> None:
    """The properties can fail: a valid scenario claimed invalid is reported as run on invalid input,
    and a refusal must be one line."""
    _, doc = SCENARIOS[0]
    case = fz.scenario_case(doc, True, "claimed invalid", 0)
    assert any("exit status 0 on invalid input" in v for v in fz.violations(case, fz.run_case(case)))
    two_lines = fz.Outcome(rc=2, err="ovsim: error: a\nmore\n", seconds=0.1, stray_files=[])
    assert fz.violations(case, two_lines)
    stray = fz.Outcome(rc=1, err="", seconds=0.1, stray_files=["x.png"])
    assert fz.violations(case, stray) == ["wrote files it was not asked for: ['x.png']"]


def test_a_gemm_of_a_million_times_the_work_ends_in_seconds(tmp_path: Path) -> None:
    """Found by this campaign: where a kernel held two layers of blocks on the same SMs (room freed
    by a finished collective), the engine stepped its waves one by one, for hours. Each layer now
    refills itself wave after wave in the fast-forward."""
    import subprocess
    import sys

    text = (fz.EXAMPLES / "gemm-allreduce-a100x4-priority.yaml").read_text()
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text.replace("    n: 8192\n", "    n: 8.192e9\n"))
    try:
        done = subprocess.run([sys.executable, "-m", "ovsim.cli", "predict", str(scenario), "--quiet"],
                              timeout=20, capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("still simulating after 20 s")
    assert done.returncode == 0
