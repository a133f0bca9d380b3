"""The runtime SDK: what an agent runtime imports to run tools through the ledger.

Modules, in the order a call meets them: `tools` (declarations), `effects` (retry rules),
`context` (what a tool receives), `ledger` (`Ledger.call`), `replay` and `reconcile` (keys
already in the ledger), `protocol` (reserve -> execute -> record and its waiting policies),
`executor` (attempts and classification), `recording` (outcome events, background appends),
`port` and `stack_port` (everything the runtime reads and appends), `outcome` (what the caller
gets), `errors`; `runs` (the `AgentRun` driver) and `pauses` (when a paused run may resume).
The public names are re-exported by `toolledger`; import them from there.
"""
