"""The `/v1/tool-executions` routes: thin HTTP over `OperatorService`.

Each route authenticates, calls the service with the token's tenant and operator id, and turns
the record it gets back into the response body. Errors are raised by the service
(`OperatorError`) and shaped by the app's handlers, so a route never builds an error body.

A key is `<run_id>:<tool_call_id>`, and a tool_call_id is whatever an agent framework made it
(a thread id may hold `/`, `?`, `#`, `%`, spaces, any unicode). The key is the rest of the path
(`{key:path}`), percent-encoded by the client (`urllib.parse.quote(key, safe="")`, or `safe=":/"`
since `:` and `/` may also stay literal); the server decodes it once. The decision routes end in
a fixed action segment (`/resolve`, ...) after the key, and the only GET route under a key is
`show`, so a key that itself ends in `/resolve` is still addressed unambiguously: GET
`.../r1:a/resolve` shows the call `r1:a/resolve`, POST `.../r1:a/resolve/resolve` resolves it.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args

from fastapi import APIRouter, Depends, Path, Query, Request

from toolledger.api.auth import Acting, Context, Viewer, operator_of
from toolledger.api.errors import InvalidRequest
from toolledger.api.schemas import (
    CompensateRequest,
    CompensationResult,
    DecisionRequest,
    ErrorResponse,
    HistoryItem,
    ResolveRequest,
    ToolExecution,
    ToolExecutionDetail,
    ToolExecutionPage,
)
from toolledger.api.service import MAX_PAGE, Approval
from toolledger.events.records import CallStatus

STATUSES: tuple[CallStatus, ...] = get_args(CallStatus)
_STATUS = "|".join(STATUSES)
_NO_NUL = r"^[^\x00]*$"


def _key(example: str, what: str) -> Any:
    """The `{key}` path parameter, documented with an example key of a call in `what` state."""
    return Path(
        description="The call key `<run_id>:<tool_call_id>`, percent-encoded (any character).",
        openapi_examples={what: {"summary": f"a call that is {what}", "value": example}},
    )


UnknownKey = Annotated[str, _key("r1:c7", "indeterminate")]
AwaitingKey = Annotated[str, _key("r1:c8", "awaiting_approval")]
CompletedKey = Annotated[str, _key("r1:c9", "completed")]


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries saying that these statuses answer with `ErrorResponse`."""
    described = {
        401: "No valid bearer token (missing, unknown, expired or revoked).",
        403: "The token's role may not do this.",
        404: "No such call in the token's tenant.",
        409: "The ledger refused the decision; the body says what the call is now.",
        413: "The request body is too large.",
        422: "The request is malformed; the message says which part.",
        503: "Kafka, the projector or PostgreSQL did not answer in time.",
    }
    return {s: {"model": ErrorResponse, "description": described[s]} for s in statuses}


router = APIRouter(prefix="/v1/tool-executions", tags=["tool executions"])
_READ = errors(401, 404, 422, 503)
_DECIDE = errors(401, 403, 404, 409, 413, 422, 503)


def _only(*names: str) -> Any:
    """A dependency refusing query parameters the route does not take: a misspelt filter
    (`?statuses=...`) must not silently list everything."""

    def check(request: Request) -> None:
        unknown = sorted(set(request.query_params) - set(names))
        if unknown:
            takes = f"it takes {', '.join(names)}" if names else "it takes none"
            raise InvalidRequest(
                "unknown_parameter",
                f"unknown query parameter {', '.join(repr(u) for u in unknown)}; {takes}",
            )

    return Depends(check)


def _statuses(text: str | None) -> frozenset[CallStatus]:
    if not text:
        return frozenset()
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown:
        raise InvalidRequest(
            "invalid_status",
            f"unknown status {', '.join(unknown)}; use a comma-separated list of "
            f"{', '.join(STATUSES)}",
        )
    return frozenset(s for s in STATUSES if s in wanted)


@router.get(
    "",
    response_model=ToolExecutionPage,
    responses=errors(401, 422, 503),
    dependencies=[_only("status", "tool", "run_id", "contested", "limit", "cursor")],
)
async def list_tool_executions(
    token: Viewer,
    context: Context,
    status: Annotated[
        str | None,
        Query(
            description="Comma-separated statuses, e.g. `indeterminate,started` (default: any).",
            pattern=rf"^\s*({_STATUS})\s*(,\s*({_STATUS})\s*)*$",
        ),
    ] = None,
    tool: Annotated[str | None, Query(description="Only this tool.", pattern=_NO_NUL)] = None,
    run_id: Annotated[str | None, Query(description="Only this run.", pattern=_NO_NUL)] = None,
    contested: Annotated[
        bool | None,
        Query(
            description="`true`: only contested calls (settled, then a late outcome contradicted "
            "the settlement; they wait for an operator's new decision). `false`: only the others."
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Page size.")] = 50,
    cursor: Annotated[
        str | None, Query(description="`next_cursor` of the previous page.", pattern=_NO_NUL)
    ] = None,
) -> ToolExecutionPage:
    """The token's tenant's calls, longest-waiting first (oldest change first)."""
    page = await context.service.list_calls(
        operator_of(token),
        statuses=_statuses(status),
        tool=tool,
        run_id=run_id,
        contested=contested,
        limit=limit,
        cursor=cursor,
    )
    return ToolExecutionPage(
        items=[ToolExecution.of(r) for r in page.items], next_cursor=page.next_cursor
    )


@router.post(
    "/{key:path}/resolve",
    response_model=ToolExecution,
    responses=_DECIDE,
    dependencies=[_only()],
)
async def resolve_tool_execution(
    token: Acting, context: Context, key: UnknownKey, body: ResolveRequest
) -> ToolExecution:
    """Settle an unknown call (or a started one past its deadline) as completed or failed.

    409 when the call moved (`status_mismatch`, `version_mismatch`) or is still within its
    deadline (`before_deadline`, with `resolvable_after`).
    """
    record = await context.service.resolve(
        operator_of(token),
        key,
        outcome=body.outcome,
        reason=body.reason,
        value=body.value,
        result_reference=body.result_reference,
        expected_version=body.expected_version,
    )
    return ToolExecution.of(record)


def _approval_route(decision: Approval, summary: str) -> None:
    """Register `POST /<key>/<decision>`: approving and rejecting differ by the decision only."""

    async def route(
        token: Acting, context: Context, key: AwaitingKey, body: DecisionRequest
    ) -> ToolExecution:
        record = await context.service.decide_approval(
            decision,
            operator_of(token),
            key,
            reason=body.reason,
            expected_version=body.expected_version,
        )
        return ToolExecution.of(record)

    route.__name__ = route.__qualname__ = f"{decision}_tool_execution"
    route.__doc__ = summary
    router.post(
        f"/{{key:path}}/{decision}",
        response_model=ToolExecution,
        responses=_DECIDE,
        dependencies=[_only()],
    )(route)


_approval_route(
    "approve", "Let a call that awaits approval run; its run's driver then reserves it again."
)
_approval_route("reject", "Refuse a call that awaits approval: it becomes failed, not attempted.")


@router.post(
    "/{key:path}/compensate",
    response_model=CompensationResult,
    responses=_DECIDE,
    dependencies=[_only()],
)
async def compensate_tool_execution(
    token: Acting, context: Context, key: CompletedKey, body: CompensateRequest
) -> CompensationResult:
    """Undo a completed call: run its tool's compensation once, as the call `<key>:compensate`.

    409 unless the call is completed (or `compensating`, which finishes an interrupted
    compensation), or when this API has no compensation for the call's tool.
    """
    done = await context.service.compensate(operator_of(token), key, reason=body.reason)
    return CompensationResult(
        record=ToolExecution.of(done.record),
        compensation=None if done.compensation is None else ToolExecution.of(done.compensation),
    )


# Registered last: `{key:path}` also matches `<key>/resolve`, and Starlette answers a method
# it does not route (OPTIONS, a 405's Allow) from the first route whose path matches.
@router.get(
    "/{key:path}", response_model=ToolExecutionDetail, responses=_READ, dependencies=[_only()]
)
async def show_tool_execution(
    token: Viewer, context: Context, key: UnknownKey
) -> ToolExecutionDetail:
    """A call's record and its full history: every event, accepted or rejected, with why."""
    record, history = await context.service.show(operator_of(token), key)
    return ToolExecutionDetail(
        record=ToolExecution.of(record), history=[HistoryItem.of(h) for h in history]
    )
