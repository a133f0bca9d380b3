"""Tool declarations: `Toolset`, the `@toolset.tool(...)` decorator, and what it derives.

Everything the ledger needs to know about a tool is derived once, at declaration, from the
function and its side effect, so a replay never needs to run or even import the tool's code:

- **Arguments** are validated by a pydantic model built from the signature (every parameter but
  the trailing `context: ToolContext`). The canonical JSON of the validated arguments is what
  `reserved` carries and what `args_digest` fingerprints, so `{"amount": "25"}` and
  `{"amount": 25}` for an `int` parameter are the same call, and a reworded argument is a
  `KeyConflictError`, not a silent second call.
- **Results** are stored as JSON by a pydantic `TypeAdapter` of the declared return type and
  restored to that type on replay: a replayed call returns a `Credit`, not a dict.
- **Whether the tool marks sending**: the runtime reads the function's source (`ast`) for an
  attribute access `<context>.sending` on its context parameter. A tool whose source has none,
  or whose source cannot be read, is treated as sending from its first line: any error of a
  write is then `indeterminate` (except `ToolNotAttemptedError` and `ToolFailedError`), which is
  the conservative answer. Calling `sending()` through a helper or an alias of the context is
  therefore not seen; pass the context itself and write `context.sending()` in the tool.
- **Whether the tool passes its idempotency key**, read the same way (`<context>.idempotency_key`,
  `key_passing_problem`). `toolledger.testing.assert_tool_contract` reports a tool that does not
  (and has no reconcile hook); a pipelined tool that does not is refused at declaration
  (`PipeliningRefused`), because a pipelined call may reach the other system twice and only the
  key makes the second request harmless.
- **Helpers that send for the tool.** A call that hands the context itself to a function or
  method marked `SENDS_WITH_KEY` (`await payments.post(url, context=context)`, with `payments`
  a `toolledger.http.ToolHTTP`) counts as both: the helper passes the key and marks sending at
  the moment the request leaves. The callee is found by resolving the call's dotted name in the
  tool's globals and closure without running anything (`inspect.getattr_static`), so the client
  must be a module-level (or enclosing) name defined before the tool is declared.
- **Resending as the lookup** (`external(replays_key_for=...)`): such a tool must pass its key
  (checked as above) and has no reconcile hook of its own; its unknown calls are settled by
  resending them (`toolledger.runtime.resend`).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import logging
import textwrap
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, ParamSpec, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError

from toolledger.events.models import canonical_json, digest_of_canonical
from toolledger.events.records import CallRecord
from toolledger.runtime.context import ToolContext
from toolledger.runtime.effects import PipeliningRefused, SideEffect

log = logging.getLogger("toolledger.runtime")

P = ParamSpec("P")
T = TypeVar("T")

#: The attribute (set to True) that marks a function or method as one that, handed a tool's
#: context, passes its idempotency key downstream and marks sending (`toolledger.http`).
SENDS_WITH_KEY = "__toolledger_sends_with_key__"

#: What a reconcile or compensation hook receives: the ledger's record of the call.
ToolExecutionRecord = CallRecord


@dataclass(frozen=True)
class ReconcileOutcome:
    """What a reconcile hook found in the other system.

    `completed` (with the real `value`, stored as the call's result), `failed` (the effect
    definitely did not happen) or `unknown` (the hook cannot tell). `detail` is kept for people.
    """

    status: Literal["completed", "failed", "unknown"]
    value: Any = None
    result_reference: str | None = None
    detail: str = ""


ReconcileHook = Callable[[CallRecord, ToolContext], Awaitable[ReconcileOutcome]]
CompensationHook = Callable[[CallRecord, ToolContext], Awaitable[Any]]


@dataclass(frozen=True)
class PreparedCall:
    """Validated arguments: the values to call with, their canonical JSON and its digest."""

    values: dict[str, Any]
    arguments_json: str
    digest: str


class Tool(Generic[P, T]):
    """A declared tool: the function plus everything derived from its declaration.

    Calling the tool object calls the function directly (no ledger), which is what a unit test
    of the tool's own logic wants, with `toolledger.testing.fake_tool_context()`.
    """

    def __init__(
        self,
        fn: Callable[P, Awaitable[T]],
        *,
        name: str,
        effect: SideEffect,
        reconcile: ReconcileHook | None,
        compensation: CompensationHook | None,
        timeout: float,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"tool {name} must be an `async def` function")
        if timeout <= 0:
            raise ValueError(f"tool {name} needs a positive timeout, not {timeout}")
        self.fn = fn
        self.name = name
        self.effect = effect
        self.reconcile = reconcile
        self.compensation = compensation
        self.timeout = timeout
        self.__doc__ = fn.__doc__
        self.signature = inspect.signature(fn)
        try:
            self.hints = get_type_hints(fn, include_extras=True)
        except (NameError, TypeError) as exc:
            raise TypeError(
                f"tool {name}: its type hints cannot be resolved ({exc}); define the types it "
                "uses at module level"
            ) from exc
        self.context_param = _context_param(name, self.signature, self.hints)
        self._params = [
            p for p in self.signature.parameters.values() if p is not self.context_param
        ]
        self._arguments = _arguments_model(name, self._params, self.hints)
        self.return_type: Any = self.hints.get("return", Any)
        self._result: TypeAdapter[T] = TypeAdapter(self.return_type)
        context = self.context_param.name
        self.marks_sending = (
            uses_context_attribute(fn, context, "sending") is True
            or sends_with_context(fn, context) is True
        )
        if effect.replays_key_for is not None:
            _check_resendable(name, fn, context, reconcile)
        if effect.pipelined:
            problem = key_passing_problem(fn, self.context_param.name)
            if problem is not None:
                raise PipeliningRefused(
                    f"tool {name} cannot be pipelined: {problem}. A pipelined call may reach the "
                    "other system twice, and only the key makes the second request harmless: "
                    f"pass {self.context_param.name}.idempotency_key to the system it changes, "
                    "or declare it without pipelined=True"
                )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name} {self.effect.kind}>"

    @property
    def resends(self) -> bool:
        """Whether an unknown call of this tool is settled by resending it with the same key
        (`external(replays_key_for=...)`, `toolledger.runtime.resend`)."""
        return self.effect.replays_key_for is not None

    @property
    def budget(self) -> float:
        """The longest a call may take, all attempts and backoffs included: the reservation's
        deadline is `now + budget`, after which others may settle the call."""
        return self.effect.max_attempts * self.timeout + self.effect.worst_case_backoff()

    @property
    def arguments_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments, by parameter name (what a model is shown)."""
        schema = self._arguments.model_json_schema(by_alias=True)
        schema["title"] = self.name
        return schema

    def prepare(self, arguments: Mapping[str, Any]) -> PreparedCall:
        """Validate `arguments`; raises pydantic's `ValidationError` if they do not fit."""
        model = self._arguments.model_validate(dict(arguments))
        as_json = model.model_dump(mode="json", by_alias=True)
        text = canonical_json(as_json)
        values = {p.name: getattr(model, _field(i)) for i, p in enumerate(self._params)}
        return PreparedCall(values=values, arguments_json=text, digest=digest_of_canonical(text))

    def dump_result(self, value: Any) -> str:
        """The result as stored JSON. A value that does not fit the declared type is stored
        as plain JSON (logged): its effect happened, and losing the result would be worse."""
        try:
            return self._result.dump_json(value, warnings="error").decode()
        except (PydanticSerializationError, ValueError, TypeError):
            pass
        try:
            return self._result.dump_json(self._result.validate_python(value)).decode()
        except (ValidationError, PydanticSerializationError, ValueError, TypeError) as exc:
            log.warning(
                "result of %s does not fit %r (%s); stored as plain JSON",
                self.name,
                self.return_type,
                exc,
            )
            return canonical_json(value)

    def load_result(self, result_json: str) -> T:
        """The stored result restored to the declared return type (`ValidationError` if not)."""
        return self._result.validate_json(result_json)

    @property
    def return_type_name(self) -> str:
        return getattr(self.return_type, "__name__", repr(self.return_type))


class Toolset:
    """A named group of tools; a tool's name is `<toolset>.<function name>`."""

    def __init__(self, name: str) -> None:
        if not name or ":" in name:
            raise ValueError(f"a toolset needs a non-empty name without ':', not {name!r}")
        self.name = name
        self._tools: dict[str, Tool[Any, Any]] = {}

    def tool(
        self,
        effect: SideEffect,
        *,
        reconcile: ReconcileHook | None = None,
        compensation: CompensationHook | None = None,
        timeout: float = 30.0,
    ) -> Callable[[Callable[P, Awaitable[T]]], Tool[P, T]]:
        """Declare an async tool with its side effect, hooks and per-attempt timeout (s)."""

        def declare(fn: Callable[P, Awaitable[T]]) -> Tool[P, T]:
            name = f"{self.name}.{fn.__name__}"
            if name in self._tools:
                raise ValueError(f"toolset {self.name} already has a tool named {name}")
            declared = Tool(
                fn,
                name=name,
                effect=effect,
                reconcile=reconcile,
                compensation=compensation,
                timeout=timeout,
            )
            self._tools[name] = declared
            return declared

        return declare

    def __iter__(self) -> Iterator[Tool[Any, Any]]:
        return iter(self._tools.values())

    def get(self, name: str) -> Tool[Any, Any] | None:
        """The tool of that full name (`toolset.function`), if declared."""
        return self._tools.get(name)


#: What `tools=` takes: a Toolset, or any mix of Tools and Toolsets (`[billing]`, `[a, b]`).
ToolsArg = Toolset | Iterable["Tool[Any, Any] | Toolset"]


def tools_by_name(tools: ToolsArg) -> dict[str, Tool[Any, Any]]:
    """Every tool `tools` holds, by full name: the tools of each Toolset, and each Tool.

    Anything else (a function that is not declared as a tool, a module, a name) is refused
    here, when the caller is built, rather than later, when a call or a compensation cannot
    find its tool. So are two different tools of one name.
    """
    found: dict[str, Tool[Any, Any]] = {}
    items = [tools] if isinstance(tools, Toolset) else list(tools)
    for item in items:
        if isinstance(item, Toolset):
            declared = list(item)
        elif isinstance(item, Tool):
            declared = [item]
        else:
            raise TypeError(
                f"tools= takes Toolsets and tools declared with @toolset.tool(...), not {item!r}"
            )
        for tool in declared:
            if found.setdefault(tool.name, tool) is not tool:
                raise ValueError(f"two different tools are named {tool.name} in tools=")
    return found


def _field(index: int) -> str:
    # Fields are named by position and aliased to the parameter, so a parameter called `copy`
    # or `schema` cannot shadow a BaseModel attribute.
    return f"arg{index}"


def _context_param(
    name: str, signature: inspect.Signature, hints: Mapping[str, Any]
) -> inspect.Parameter:
    params = list(signature.parameters.values())
    last = params[-1] if params else None
    if last is None or not (last.name == "context" or hints.get(last.name) is ToolContext):
        raise TypeError(f"tool {name} must take `context: ToolContext` as its last parameter")
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool {name}: parameter {p.name} must be a plain named parameter")
    return last


def _arguments_model(
    name: str, params: list[inspect.Parameter], hints: Mapping[str, Any]
) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for i, p in enumerate(params):
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[_field(i)] = (hints.get(p.name, Any), Field(default, alias=p.name))
    return create_model(
        f"{name}.arguments", __config__=ConfigDict(extra="forbid", frozen=True), **fields
    )


def function_source_tree(fn: Callable[..., Any]) -> ast.AST | None:
    """The parsed source of `fn`, or None when Python cannot show it (built or generated)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def key_passing_problem(fn: Callable[..., Any], context: str) -> str | None:
    """Why `fn` cannot be shown to pass `<context>.idempotency_key` downstream, or None if its
    source reads it or hands the context to a `SENDS_WITH_KEY` helper (an alias, or a helper
    that is not marked, is not seen)."""
    reads_key = uses_context_attribute(fn, context, "idempotency_key")
    if reads_key is False and sends_with_context(fn, context):
        return None
    if reads_key is None:
        return (
            f"its source cannot be read, so it cannot be shown to pass {context}.idempotency_key "
            "downstream"
        )
    if not reads_key:
        return f"it never reads {context}.idempotency_key"
    return None


def uses_context_attribute(fn: Callable[..., Any], context: str, attribute: str) -> bool | None:
    """Whether `fn`'s source reads `<context>.<attribute>`; None if its source is unavailable."""
    tree = function_source_tree(fn)
    if tree is None:
        return None
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == attribute
        and isinstance(node.value, ast.Name)
        and node.value.id == context
        for node in ast.walk(tree)
    )


def sends_with_context(fn: Callable[..., Any], context: str) -> bool | None:
    """Whether `fn`'s source hands `<context>` itself to a `SENDS_WITH_KEY` callee (see the
    module docstring); None if its source is unavailable."""
    tree = function_source_tree(fn)
    if tree is None:
        return None
    scope = _names_in_scope(fn)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        values = [*node.args, *(k.value for k in node.keywords)]
        if any(isinstance(v, ast.Name) and v.id == context for v in values):
            callee = _resolve(node.func, scope)
            if getattr(callee, SENDS_WITH_KEY, False) is True:
                return True
    return False


_UNRESOLVED = object()


def _names_in_scope(fn: Callable[..., Any]) -> dict[str, Any]:
    names: dict[str, Any] = dict(getattr(fn, "__globals__", {}))
    with contextlib.suppress(TypeError, ValueError):
        names.update(inspect.getclosurevars(fn).nonlocals)
    return names


def _resolve(expr: ast.expr, scope: Mapping[str, Any]) -> Any:
    """The object a dotted name in the source stands for, without running any of its code."""
    if isinstance(expr, ast.Name):
        return scope.get(expr.id, _UNRESOLVED)
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, scope)
        if base is _UNRESOLVED:
            return _UNRESOLVED
        try:
            return inspect.getattr_static(base, expr.attr)
        except AttributeError:
            return _UNRESOLVED
    return _UNRESOLVED


def _check_resendable(
    name: str, fn: Callable[..., Any], context: str, reconcile: ReconcileHook | None
) -> None:
    """Refuse `replays_key_for` on a tool whose resend could not be a lookup."""
    if reconcile is not None:
        raise ValueError(
            f"tool {name} declares both replays_key_for and a reconcile hook: its unknown calls "
            "would be settled two ways. Keep the hook (a lookup) or the declaration (a resend "
            "with the same key), not both"
        )
    problem = key_passing_problem(fn, context)
    if problem is not None:
        raise ValueError(
            f"tool {name} cannot declare replays_key_for: {problem}. A resend is a lookup only "
            f"when the other system sees the same key again: pass {context}.idempotency_key "
            "downstream (or send through a toolledger.http client defined before the tool)"
        )
