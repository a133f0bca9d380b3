"""`python -m tests.runtime_only ARGS...`: the `toolledger` command as a runtime-only install
(`pip install toolledger`, no `server` extra) runs it: the server extra's modules cannot import.

Blocking them in `sys.modules` is what their absence looks like to `import`, without a second
virtualenv per test; BENCHMARKS.md measures the real installs.
"""

from __future__ import annotations

import sys

#: The server extra's modules and what only they bring in (httpx: the demo's HTTP client).
BLOCKED = ("faust", "mode", "fastapi", "starlette", "uvicorn", "jinja2", "multipart", "httpx")

if __name__ == "__main__":
    for name in BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]
    from toolledger.cli import main

    sys.argv[0] = "toolledger"
    main()
