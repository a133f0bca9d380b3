"""Persistence drills: kill the ledger's processes on purpose, then check nothing broke.

`toolledger drill` (and `tests/drills/`) run agent runs in real runtime processes against real
Kafka and PostgreSQL, SIGKILL them at named points and at random moments, kill and freeze the
projectors and the reconciler meanwhile, and then check the ledger against the billing system's
own count of effects and against a re-fold of the log. docs/DRILLS.md explains each check.

The modules, in the order a drill uses them: `services` (where PostgreSQL and Kafka are),
`billing` and `tools` (the system the runs charge, and its tools), `model` (the scripted
model), `killpoints` and `worker` (a runtime process that can die where its plan says),
`procs` (child processes, by pid), `ledgerdb` (the drill's own questions to PostgreSQL),
`driver` (the work list and the workers), `chaos` (projectors, reconciler, LISTEN sessions,
poison, PostgreSQL restarts), `operator` (the operator queue), `verify` (the re-fold),
`checks`, `reset` (the broker reset), `summary`, and `run` (`run_drill`), which puts one drill
together. Nothing is imported here: a worker process imports only what it uses.
"""
