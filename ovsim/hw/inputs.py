"""The base of every model that reads a user's file: booleans are not numbers.

Pydantic's lax mode reads ``true`` as 1 for an integer or float field, so ``m: true`` ran as a
GEMM of one row. A field whose type is a number (int or float, optionally or in a union with
None) refuses a boolean here, naming the field; a number written ``8e3`` is read as a number by
the YAML loader (``ovsim.hw.spec.read_yaml``) and taken by an integer field when it is whole.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, model_validator


def _numeric(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _numeric(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return bool(args) and all(_numeric(a) for a in args)
    return tp in (int, float)


class InputModel(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, f in cls.model_fields.items():
                key = f.alias if f.alias is not None and f.alias in data else name
                value = data.get(key)
                if isinstance(value, bool) and _numeric(f.annotation):
                    raise ValueError(f"{key}: a number is expected, not {str(value).lower()}")
        return data
