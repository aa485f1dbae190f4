"""The base of every model that reads a user's file: booleans are not numbers.

Pydantic's lax mode reads ``true`` as 1 for an integer or float field, so ``m: true`` ran as a
GEMM of one row. A field whose type is a number (int or float, optionally or in a union with
None) refuses a boolean here, naming the field; a number written ``8e3`` is read as a number by
the YAML loader (``ovsim.hw.spec.read_yaml``) and taken by an integer field when it is whole.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

from pydantic import BaseModel, model_validator


def _numeric(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _numeric(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        # A number beside words (a GEMM's efficiency or "library") is still a number; a union that
        # takes a boolean itself is not.
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return any(_numeric(a) for a in args) and not any(_takes_bool(a) for a in args)
    return tp in (int, float)


def _takes_bool(tp: Any) -> bool:
    if typing.get_origin(tp) is typing.Annotated:
        return _takes_bool(typing.get_args(tp)[0])
    if typing.get_origin(tp) is typing.Literal:
        return any(isinstance(v, bool) for v in typing.get_args(tp))
    return tp is bool


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


@functools.cache
def _number_fields(cls: type[BaseModel]) -> dict[str, str]:
    """The shape of each field that holds numbers, by its name and by its alias: "number",
    "values" (a mapping's) or "items" (a list's). Read from the annotations once per model: on
    every validation it cost a large scenario a quarter of its build time."""
    found: dict[str, str] = {}
    for name, f in cls.model_fields.items():
        tp = f.annotation
        shape = ("number" if _numeric(tp) else "values" if _numeric_values(tp) else
                 "items" if _numeric_items(tp) else "")
        if shape:
            found[name] = shape
            if f.alias is not None:
                found[f.alias] = shape
    return found


def _not_a_number(key: str, value: Any) -> ValueError:
    return ValueError(f"{key}: a number is expected, not {str(value).lower()}")


class InputModel(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        shapes = _number_fields(cls)
        # Only the numeric fields given (sorted: an error names the same one each run), each first
        # by its values' types, a set built in C: a training iteration validates 100,000s of specs.
        for key in sorted(shapes.keys() & data.keys()):
            value, shape = data[key], shapes[key]
            if shape == "number":
                if isinstance(value, bool):
                    raise _not_a_number(key, value)
            elif shape == "items":
                if isinstance(value, (list, tuple)) and bool in set(map(type, value)):
                    i = next(i for i, v in enumerate(value) if isinstance(v, bool))
                    raise _not_a_number(f"{key}.{i}", value[i])
            elif isinstance(value, dict) and bool in set(map(type, value.values())):
                k = next(k for k, v in value.items() if isinstance(v, bool))
                raise _not_a_number(f"{key}.{k}", value[k])
        return data
