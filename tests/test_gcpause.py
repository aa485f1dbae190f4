import gc

import pytest

from ovsim.gcpause import paused_gc


@pytest.fixture(autouse=True)
def _collector_back_on() -> object:
    yield
    gc.enable()


def test_paused_inside_and_restored_after() -> None:
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_exception() -> None:
    gc.enable()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("boom")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off_and_blocks_nest() -> None:
    gc.disable()
    with paused_gc():
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()
    with paused_gc():
        with paused_gc():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
