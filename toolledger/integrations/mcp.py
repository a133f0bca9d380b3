"""MCP: serve a `Toolset` whose every call goes through the ledger, keyed by the request's `_meta`.

An MCP client (an agent host, an IDE, another agent) calls `tools/call`; the server here makes
the call with `Ledger.call` under the key the request carries in `_meta`
(`dev.toolledger/run-id` + `dev.toolledger/tool-call-id`, or `dev.toolledger/key`; see
`toolledger.integrations._mcp_keys`). So a client that resends after a lost answer, a second
server behind a load balancer, or a new server after a crash, all get the recorded result of
the one call instead of making another. `call_tool_keyed` is the client side: it puts the key
in `_meta`.

What happens without a key in `_meta`: a tool that changes something (`write`, `external`,
`destructive`) is refused before anything is reserved, because without a key a resend is a new
call and the guarantee would silently not hold. A `read()` tool runs under a key the server
makes up (`mcp-unkeyed-<server>:<uuid>`, returned in the result's `_meta`), recorded like any
call; pass `unkeyed_reads=False` to refuse those too.

Unknown outcomes, failures, approvals and the duplicate-intent guard become tool results
(`isError`) whose text tells the model what is true and what to do
(`toolledger.integrations._mcp_results`); the MCP protocol has no pause and no approval
primitive, so the ledger keeps the call and the same key, asked again, returns the decision.

Serving is `toolledger mcp serve --tools mypkg.tools` (`toolledger.cli.mcp`), over stdio or
streamable HTTP; in-process, `mcp.Client(LedgerMCPServer(...).server)`.
"""

from __future__ import annotations

import importlib.metadata
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, cast

try:
    import mcp
    import mcp.types as types
    from mcp.server import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "toolledger.integrations.mcp needs the MCP SDK: install it with "
        "`pip install 'toolledger[mcp]'`"
    ) from exc

from toolledger.integrations import _mcp_keys as keys
from toolledger.integrations import _mcp_results as said
from toolledger.integrations._calls import Answer, make_call
from toolledger.integrations._common import AdapterOptions, CallKey, ToolNames, encode_run_id
from toolledger.integrations._mcp_keys import KeyMetaError, meta_for
from toolledger.runtime import (
    Ledger,
    LedgerUnavailable,
    RunQuarantined,
    RunSuperseded,
    TenantMismatchError,
    Tool,
    Toolset,
)

__all__ = ["KeyMetaError", "LedgerMCPServer", "call_tool_keyed", "meta_for"]

#: JSON-RPC "invalid params": the spec's code for an unknown tool or an unusable request.
INVALID_PARAMS = -32602

#: What the server tells the client (and through it the model) before any call.
INSTRUCTIONS = (
    "Every call of these tools is recorded in a ledger and takes effect at most once per call "
    "key (the `_meta` entries dev.toolledger/run-id and dev.toolledger/tool-call-id). Resending "
    "a call with the same key is always safe: it returns the recorded answer. When a result "
    "says the outcome is unknown, that the call awaits approval, or that it was held as a "
    "repeat, do not make the same request again as a new call: tell the user it is being "
    "checked."
)


class LedgerMCPServer:
    """An MCP server (`self.server`, the SDK's low-level `Server`) over a ledger's tools.

    `tenant_id` is this server's: every call it makes belongs to it (an MCP request cannot
    choose its tenant). `options.duplicate_intent` means what it means for `AgentRun`: `hold`
    answers a new call id that repeats the tool and arguments of an unsettled call of the same
    run with "held, not run"; `allow` runs it and notes the repeat in the call's history.
    `options.on_indeterminate` changes nothing here: MCP has no pause, so an unknown call is
    always answered "unknown, do not retry" and the client's run goes on.
    """

    def __init__(
        self,
        ledger: Ledger,
        tools: Toolset | Iterable[Tool[Any, Any]],
        *,
        tenant_id: str,
        name: str = "toolledger",
        options: AdapterOptions | None = None,
        unkeyed_reads: bool = True,
    ) -> None:
        if not tenant_id:
            raise ValueError("an MCP server of the ledger needs a tenant_id")
        self.ledger = ledger
        self.tenant_id = tenant_id
        self.options = options or AdapterOptions()
        self.unkeyed_reads = unkeyed_reads
        self.names = ToolNames(tools)
        self._unkeyed_run = f"mcp-unkeyed-{uuid.uuid4().hex[:8]}"
        self.server: Server[Any] = Server(
            name,
            version=_version(),
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    async def _list_tools(
        self, _ctx: Any, _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_describe(n, t) for n, t in self.names.items()])

    async def _call_tool(
        self, _ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await self.call(params.name, params.arguments or {}, params.meta)

    async def run_stdio(self) -> None:
        """Serve one client over stdin/stdout until it closes stdin."""
        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

    async def run_http(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        """Serve streamable HTTP at `http://<host>:<port>/mcp` until stopped (SIGINT/SIGTERM).

        Stateless: the server keeps nothing per MCP session, so any replica can answer any
        request; the ledger is what makes a call happen once across them.
        """
        import uvicorn

        app = self.server.streamable_http_app(stateless_http=True, host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="info", lifespan="on")
        await uvicorn.Server(config).serve()

    async def call(
        self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None
    ) -> types.CallToolResult:
        """One `tools/call`: the model-facing `name`, its arguments and the request's `_meta`.

        An unknown tool or an unusable key in `_meta` is a protocol error (`MCPError`, invalid
        params): the client's code is wrong, and nothing was reserved. Everything else is a
        tool result (`toolledger.integrations._mcp_results`).
        """
        tool = self.names.tool(name)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"there is no tool named {name!r} on this server")
        try:
            found = keys.key_from_meta(meta)
        except KeyMetaError as exc:
            raise MCPError(INVALID_PARAMS, f"{name}: {exc}") from None
        if found is None:
            if tool.effect.changes_something or not self.unkeyed_reads:
                return said.refused(_needs_key(name, tool), None)
            found = keys.MetaKey(self._unkeyed_run, uuid.uuid4().hex)
        key = CallKey(found.run_id, found.tool_call_id)
        try:
            answer = await make_call(
                self.ledger,
                tool,
                key,
                tenant_id=self.tenant_id,
                arguments=arguments,
                options=self.options,
            )
        except LedgerUnavailable as exc:
            return said.result(
                f"{name} was not attempted (key {key.key}): {exc}", key=key.key, status="failed"
            )
        except (RunSuperseded, RunQuarantined, TenantMismatchError) as exc:
            return said.refused(str(exc), key.key)
        if isinstance(answer, Answer):
            return said.answered(name, answer)
        return said.paused(name, answer)


def _version() -> str:
    try:
        return importlib.metadata.version("toolledger")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return ""


def _needs_key(name: str, tool: Tool[Any, Any]) -> str:
    return (
        f"{name} was not run: it is declared {tool.effect.kind}(), and this request carries no "
        f"call key. Without one a resend would be a second {name}. The MCP client must send "
        f"`_meta` {{{keys.RUN_ID!r}: <run id>, {keys.TOOL_CALL_ID!r}: <the model's tool call "
        f"id>}} (or {keys.KEY!r}: '<run_id>:<tool_call_id>'); toolledger's "
        "`call_tool_keyed` does it. Nothing was reserved or run."
    )


def _describe(name: str, tool: Tool[Any, Any]) -> types.Tool:
    read_only = not tool.effect.changes_something
    return types.Tool(
        name=name,
        title=tool.name,
        description=(tool.__doc__ or tool.name).strip(),
        input_schema=tool.arguments_schema,  # what `Tool.prepare` validates the arguments with
        annotations=types.ToolAnnotations(
            read_only_hint=read_only,
            destructive_hint=tool.effect.kind == "destructive",
            idempotent_hint=read_only,
            open_world_hint=tool.effect.kind == "external",
        ),
    )


async def call_tool_keyed(
    client: mcp.Client | mcp.ClientSession,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    run_id: str | None = None,
    tool_call_id: str | None = None,
    key: str | None = None,
    read_timeout_seconds: float | None = None,
) -> types.CallToolResult:
    """Call `name` with the call key in `_meta`, so the server makes the call once.

    The key is stable only if `tool_call_id` is: use the id of the model's tool call, taken
    from a model response the agent persisted before calling (its transcript, checkpoint or
    message history), so that a retry after a crash sends the same one. `run_id` is the
    application's id of the run (a thread or conversation id); like every adapter, this sends
    it through `encode_run_id`, so `user:42` is the ledger run `user%3A42` and never splits the
    key. A whole `key` is sent as it is (and refused if it does not split unambiguously).
    """
    if run_id is not None:
        run_id = encode_run_id(run_id)
    meta = meta_for(run_id=run_id, tool_call_id=tool_call_id, key=key)
    return await client.call_tool(
        name,
        dict(arguments or {}),
        read_timeout_seconds=read_timeout_seconds,
        meta=cast(types.RequestParamsMeta, meta),
    )
