"""Small training scenarios the training tests share: a few layers of GPT-3 XL, predicted on a
system of a few GPUs."""

from __future__ import annotations

from typing import Any

from ovsim.api import predict
from ovsim.scenario import Scenario

SMALL: dict[str, Any] = {"model": "gpt3-1.3b", "layers": 8, "micro_batch_size": 1, "seq_len": 1024,
                         "precision": "bf16"}


def predict_training(training: dict[str, Any], system: str = "a100x4", schedule: str = "overlapped",
                     mode: str = "simulate", power_managed: bool = True) -> Any:
    sc = Scenario.model_validate({"name": "t", "system": system, "schedule": schedule, "mode": mode,
                                  "training": training})
    return predict(sc, power_managed=power_managed)
