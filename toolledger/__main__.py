"""`python -m toolledger` is the `toolledger` command."""

from toolledger.cli import main

main()
