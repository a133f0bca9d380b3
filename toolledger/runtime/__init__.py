"""The runtime SDK: what an agent runtime imports to run tools through the ledger.

Modules, in the order a call meets them: `tools` (declarations), `effects` (retry rules),
`context` (what a tool receives), `ledger` (`Ledger.call`), `replay` (keys already in the
ledger), `executor` (attempts and classification), `recording` and `access` (appends and
verdicts), `outcome` (what the caller gets), `errors`. The public names are re-exported by
`toolledger`; import them from there.
"""
