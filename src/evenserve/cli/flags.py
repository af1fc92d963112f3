"""A command whose flags are generated from typed settings: each setting's flag (its name, type,
default and help) becomes a parameter of the command's signature, which typer reads."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Protocol, TypeVar, cast

import typer

F = TypeVar("F", bound=Callable[..., Any])


class FlagSpec(Protocol):
    """What a flag says of itself (``worker.settings.Flag``)."""

    @property
    def name(self) -> str: ...
    @property
    def decls(self) -> tuple[str, ...]: ...
    @property
    def annotation(self) -> Any: ...
    @property
    def default(self) -> Any: ...
    @property
    def required(self) -> bool: ...
    @property
    def help(self) -> str: ...


def with_flags(specs: Iterable[FlagSpec]) -> Callable[[F], F]:
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
