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


def _numeric_values(tp: Any) -> bool:
    """A mapping whose values are numbers (a scenario's stream priorities)."""
    if typing.get_origin(tp) is not dict:
        return False
    args = typing.get_args(tp)
    return len(args) == 2 and _numeric(args[1])


def _numeric_items(tp: Any) -> bool:
    """A list or tuple of numbers (a GEMM's tile), optionally or in a union with None."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _numeric_items(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_numeric_items(a) for a in typing.get_args(tp) if a is not type(None))
    if origin not in (list, tuple):
        return False
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    return bool(args) and all(_numeric(a) for a in args)


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
                if isinstance(value, dict) and _numeric_values(f.annotation):
                    for k, v in value.items():
                        if isinstance(v, bool):
                            raise ValueError(f"{key}.{k}: a number is expected, not {str(v).lower()}")
                if isinstance(value, (list, tuple)) and _numeric_items(f.annotation):
                    for i, v in enumerate(value):
                        if isinstance(v, bool):
                            raise ValueError(f"{key}.{i}: a number is expected, not {str(v).lower()}")
        return data
