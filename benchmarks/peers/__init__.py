"""toolledger beside Restate and DBOS: the same workloads, in one run (`make bench-peers`).

`restate_service.py` and `dbos_worker.py` run in the peers' own virtualenv and import nothing of
toolledger; the other modules run in toolledger's and import neither peer.
"""
