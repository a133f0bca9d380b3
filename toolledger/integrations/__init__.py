"""toolledger for agent frameworks: each framework's tool calls go through the ledger.

One module per framework, each importing its framework lazily (an extra each, named in the
error when it is missing); importing this package imports no framework:

- `toolledger.integrations.langgraph`: a `ToolNode` wrapper (`awrap_tool_call`), keyed by the
  graph's `thread_id`; unknown calls pause with `interrupt()`.
- `toolledger.integrations.pydantic_ai`: a toolset with a stable id, keyed by the
  `conversation_id`; unknown calls are deferred (`CallDeferred`).
- `toolledger.integrations.openai_agents`: `FunctionTool`s, keyed by a run id the application
  puts in its run context; unknown calls stop the run as an interruption with a resumable
  `RunState`.

What they share, framework-free, is in `toolledger.integrations._common` (model-facing tool
names, call keys, what the model hears, the adapter options) and `_calls` (one call through
the ledger, with the duplicate-intent guard); `_runs` (`RunPauses`) records a framework's pause
as the run's, through the runtime's `FrameworkRuns`, so `toolledger resumer` wakes it. See
docs/integrations/.
"""

from toolledger.integrations._calls import Answer, Pause, make_call
from toolledger.integrations._common import (
    AdapterOptions,
    CallKey,
    ToolNames,
    call_key_for,
    decode_run_id,
    encode_run_id,
    model_tool_name,
)
from toolledger.integrations._runs import RunPauses, RunStillPaused

__all__ = [
    "AdapterOptions",
    "Answer",
    "CallKey",
    "Pause",
    "RunPauses",
    "RunStillPaused",
    "ToolNames",
    "call_key_for",
    "decode_run_id",
    "encode_run_id",
    "make_call",
    "model_tool_name",
]
