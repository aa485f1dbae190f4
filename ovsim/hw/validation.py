"""Pydantic's validation errors as ovsim's one-line errors: the field that failed, named as the
file names it, and for a misspelt key the field meant."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from ovsim.errors import OvsimError

# A location step pydantic adds for one alternative of a union (``str``, ``InlineSystem``,
# ``literal['all']``, ``list[constrained-int]``): the type tried, not a key of the file. Keys of
# ovsim's files are lower case, so a capitalised step is a model's name.
_UNION_STEP = re.compile(r"^(?:str|int|float|bool|none|[a-z][a-z-]*\[.*\]|_?[A-Z]\w*)$")


def _union_step(loc: tuple[int | str, ...], i: int) -> bool:
    step = loc[i] if i < len(loc) else 0
    return isinstance(step, str) and _UNION_STEP.match(step) is not None


def validation_error(e: ValidationError, source: str, model: type[BaseModel] | None = None) -> OvsimError:
    """The first pydantic error as a one-line OvsimError naming the field.

    A value that matches no alternative of a union gets one error per alternative; the one that
    got furthest into the value says what is wrong (a mapping for an inline system whose
    ``gpu_count`` is 0 is not "not a valid string"), and the type step is left out of the field.
    ``model``: the model validated, whose field names suggest what a misspelt key meant."""
    errors = e.errors()
    misspelt = _misspelt(errors, model)
    if misspelt is not None:
        return OvsimError(misspelt[1], source=source, field=".".join(str(p) for p in misspelt[0]))
    first = errors[0]
    loc = tuple(first["loc"])
    chosen = [first]
    cut = next((i for i in range(len(loc)) if _union_step(loc, i)), None)
    if cut is not None:
        branches = [x for x in errors if tuple(x["loc"])[:cut] == loc[:cut] and _union_step(tuple(x["loc"]), cut)]
        # One error alone at such a step is a key that looks like a type name, not a union.
        if len(branches) > 1:
            # A wrong type for one alternative (a list is not the literal 'all') says less than a
            # wrong value for another.
            typed = [x for x in branches if not x["type"].endswith("_type") and x["type"] != "literal_error"] \
                or branches
            depth = max(len(x["loc"]) for x in typed)
            chosen = [x for x in typed if len(x["loc"]) == depth]
            loc = _without(tuple(chosen[0]["loc"]), cut)
            chosen = [x for x in chosen if _without(tuple(x["loc"]), cut) == loc]
    message = ", or ".join(dict.fromkeys(_message(x) for x in chosen))
    return OvsimError(message, source=source, field=".".join(str(p) for p in loc))


# Names other tools give ovsim's fields (Megatron-LM's arguments, common spellings): a key written so
# is answered with the field it means, which spelling alone would not find ("tensor_parallel" is
# nearer "sequence_parallel" than "tp").
_OTHER_NAMES = {
    "tensor_parallel": "tp", "tensor_model_parallel_size": "tp", "tensor_parallel_size": "tp",
    "pipeline_parallel": "pp", "pipeline_model_parallel_size": "pp", "pipeline_parallel_size": "pp",
    "data_parallel": "dp", "data_parallel_size": "dp",
    "context_parallel": "cp", "context_parallel_size": "cp",
    "virtual_pipeline_model_parallel_size": "virtual_stages",
}


def _misspelt(errors: list[Any], model: type[BaseModel] | None = None) -> tuple[tuple[int | str, ...], str] | None:
    """A key the model does not know, spelt like a required one it misses or (given the ``model``)
    like any field it has there: the misspelling (as pydantic has it, "field required" alone hides
    the key the user wrote, and "extra inputs are not permitted" the one they meant)."""
    import difflib

    missing = [tuple(x["loc"]) for x in errors if x["type"] == "missing"]
    for x in errors:
        if x["type"] != "extra_forbidden":
            continue
        loc = tuple(x["loc"])
        near = difflib.get_close_matches(str(loc[-1]), [str(m[-1]) for m in missing if m[:-1] == loc[:-1]], n=1)
        other = _OTHER_NAMES.get(str(loc[-1]))
        if not near and model is not None and other in _fields_at(model, loc[:-1]):
            near = [other]
        if not near and model is not None:
            near = difflib.get_close_matches(str(loc[-1]), sorted(_fields_at(model, loc[:-1])), n=1)
        if near:
            return loc[:-1], f"unknown field '{loc[-1]}'; did you mean '{near[0]}'?"
    return None


def _alternatives(annotation: Any) -> list[Any]:
    """The types a field's annotation allows: unions and Annotated unwrapped."""
    import typing
    from types import UnionType

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _alternatives(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is UnionType:
        return [t for a in typing.get_args(annotation) for t in _alternatives(a)]
    return [annotation]


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> set[str]:
    """The field names (and aliases) the models at ``loc`` below ``model`` have. A step that no
    candidate has as a field, a list index or a mapping key is a union's tag and is passed over."""
    import typing

    current: list[Any] = [model]
    for step in loc:
        following: list[Any] = []
        for t in (a for c in current for a in _alternatives(c)):
            origin, args = typing.get_origin(t), typing.get_args(t)
            if isinstance(t, type) and issubclass(t, BaseModel):
                field = t.model_fields.get(str(step)) or next(
                    (f for f in t.model_fields.values() if f.alias == step), None)
                if field is not None:
                    following.append(field.annotation)
            elif origin in (list, tuple, Sequence) and isinstance(step, int) and args:
                following.append(args[0])
            elif origin is dict and len(args) == 2:
                following.append(args[1])
        current = following or current
    names: set[str] = set()
    for t in (a for c in current for a in _alternatives(c)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            names |= {n for n in t.model_fields} | {f.alias for f in t.model_fields.values() if f.alias}
    return names


def _without(loc: tuple[int | str, ...], i: int) -> tuple[int | str, ...]:
    return loc[:i] + loc[i + 1:]


def _message(error: Any) -> str:
    if error["type"] == "union_tag_invalid":
        return _tag_message(error)
    # A ValueError raised by a validator reads "Value error, <its text>": the text is the message.
    msg: str = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def _tag_message(error: Any) -> str:
    """An unknown tag of a tagged union (an op's ``kind``), with the known one spelt most like it."""
    import difflib

    ctx = error.get("ctx") or {}
    tag, key = str(ctx.get("tag", "")), str(ctx.get("discriminator", "kind")).strip("'")
    known = [t.strip().strip("'") for t in str(ctx.get("expected_tags", "")).split(",") if t.strip()]
    near = difflib.get_close_matches(tag, known, n=1, cutoff=0.6)
    hint = f"; did you mean '{near[0]}'?" if near else f" (one of {', '.join(known)})"
    return f"unknown {key} '{tag}'{hint}"

