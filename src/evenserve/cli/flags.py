"""A command whose flags are generated from typed settings (a pydantic model): each field is
the flag ``--some-name`` with the field's type, default and description as its help; a field
that is itself a model (the device or queue options) gives one flag per field of its own,
defaulted from the field's default. The flags become the parameters of the command's
signature, which typer reads."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a setting."""

    #: The field's name (the command's parameter).
    name: str
    #: Its declarations when it has more names than ``--some-name`` (that one first).
    decls: tuple[str, ...]
    annotation: Any
    #: None where the flag is required.
    default: Any
    required: bool
    help: str


def _fields(model: type[BaseModel]) -> dict[str, tuple[FieldInfo, Any, bool]]:
    """Each flag's field, default and whether it is an embedded model's (by name)."""
    out: dict[str, tuple[FieldInfo, Any, bool]] = {}
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            for sub, sub_info in kind.model_fields.items():
                out[sub] = (sub_info, getattr(info.default, sub), True)
        else:
            out[name] = (info, info.default, False)
    return out


def flags_of(
    model: type[BaseModel],
    order: Iterable[str],
    notes: Mapping[str, str] | None = None,
    aliases: Mapping[str, tuple[str, ...]] | None = None,
) -> list[Flag]:
    """The flags of ``model`` in ``order`` (every flag once). An embedded option's help is
    its description capitalized, with its ``notes`` in parentheses, and a full stop; a
    field of the model's own is its description as written."""
    fields = _fields(model)
    order = list(order)
    if sorted(order) != sorted(fields):
        raise ValueError(f"the flag order misses or repeats flags of {model.__name__}")
    out: list[Flag] = []
    for name in order:
        info, default, embedded = fields[name]
        text = info.description or ""
        if embedded:
            note = (notes or {}).get(name)
            text = text[:1].upper() + text[1:] + (f" ({note})" if note else "") + "."
        more = (aliases or {}).get(name, ())
        decls = ("--" + name.replace("_", "-"), *more) if more else ()
        required = default is PydanticUndefined
        out.append(
            Flag(name, decls, info.annotation, None if required else default, required, text)
        )
    return out


def with_flags(specs: Iterable[Flag]) -> Callable[[F], F]:
    """Give a command taking ``**flags`` the signature typer builds its options from."""

    def wrap(command: F) -> F:
        params = []
        annotations: dict[str, Any] = {}
        for f in specs:
            # Annotated[<the setting's type>, typer.Option(...)], its type known only now.
            hint = cast(Any, Annotated)[f.annotation, typer.Option(*f.decls, help=f.help)]
            annotations[f.name] = hint
            default = inspect.Parameter.empty if f.required else f.default
            params.append(
                inspect.Parameter(
                    f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint
                )
            )
        annotations["return"] = None
        signature = inspect.Signature(params, return_annotation=None)
        command.__signature__ = signature  # type: ignore[attr-defined]
        command.__annotations__ = annotations
        return command

    return wrap
