"""The `/v1/runs` routes: a run as the ledger holds it, and the paused runs of a tenant.

The operator API decides about calls; runs are read-only here. They answer what an operator
asks once a call is settled: did the run go on? A paused run whose resume hook kept failing
carries `resume_error` (set by the resumer's `run_resume_failed`, cleared when the run moves
on), so `GET /v1/runs?resume_failed=true` lists the runs someone has to look at.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from toolledger.api.auth import Context, Viewer, operator_of
from toolledger.api.errors import NotFound
from toolledger.api.routes import errors
from toolledger.events.records import RunRecord, RunStatus

router = APIRouter(prefix="/v1/runs", tags=["runs"])


class Run(BaseModel):
    """A run: its status, the call a paused run waits on, and why it did not go on."""

    run_id: str
    tenant_id: str | None
    status: RunStatus
    agent: str
    version: int | None = Field(description="Its checkpoint version; null without run fencing.")
    waiting_on: str | None = Field(description="The call key a paused run waits on.")
    resume_error: str | None = Field(
        description="Set while a paused run's resume hook has failed every attempt: how often "
        "and its last error. Fix the hook and restart the resumer; it tries again."
    )
    quarantined: bool
    quarantine_reason: str | None
    updated_at: datetime | None

    @classmethod
    def of(cls, run: RunRecord) -> Run:
        return cls(
            run_id=run.run_id,
            tenant_id=run.tenant_id,
            status=run.status,
            agent=run.agent,
            version=run.version,
            waiting_on=run.waiting_on,
            resume_error=run.resume_error,
            quarantined=run.quarantined,
            quarantine_reason=run.quarantine_reason,
            updated_at=run.updated_at,
        )


class RunList(BaseModel):
    items: list[Run]


@router.get("", response_model=RunList, responses=errors(401, 422, 503))
async def list_paused_runs(
    token: Viewer,
    context: Context,
    resume_failed: Annotated[
        bool,
        Query(description="`true`: only the paused runs whose resume hook failed every try."),
    ] = False,
) -> RunList:
    """The token's tenant's paused runs (awaiting reconciliation or approval, or a duplicate
    intent's decision), oldest change first."""
    runs = await context.service.paused_runs(operator_of(token), resume_failed=resume_failed)
    return RunList(items=[Run.of(r) for r in runs])


@router.get("/{run_id}", response_model=Run, responses=errors(401, 404, 422, 503))
async def show_run(
    token: Viewer, context: Context, run_id: Annotated[str, Path(description="The run id.")]
) -> Run:
    """One run of the token's tenant."""
    run = await context.service.run(operator_of(token), run_id)
    if run is None:
        raise NotFound("not_found", f"no run {run_id!r} in this tenant")
    return Run.of(run)
