"""Apache Kafka's jars for the dev stack, resolved once with Maven from Maven Central.

The broker is the `kafka_2.13` artifact plus a logging binding, pinned in `kafka-pom.xml` (package
data, so an installed toolledger finds it too) at the version `docker-compose.yml` runs. Maven
downloads the jars into its local repository (`~/.m2`) and writes their classpath, which is kept
in the user's cache directory under the pom's digest: later starts read it and never call Maven
(it costs 15-30 s even with every jar present), unless a jar has gone from the repository or the
pom changed. The first resolve shows Maven's downloads as they happen.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from toolledger.dev.processes import DevStackError, DevStackMissing

#: The version pinned in kafka-pom.xml; docker-compose.yml names the same image tag.
KAFKA_VERSION = "3.9.1"
POM = "kafka-pom.xml"
_DOWNLOADED = re.compile(r"Downloaded from \S+: (\S+) \(([^)]*?)(?: at [^)]*)?\)")

Progress = Callable[[str], None]


def cache_dir() -> Path:
    """Where resolved classpaths are kept: `$XDG_CACHE_HOME/toolledger`, else ~/.cache/..."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolledger"


def pom_text() -> str:
    return resources.files("toolledger.dev").joinpath(POM).read_text()


def cached_classpath() -> list[Path] | None:
    """The classpath a previous resolve wrote, if every jar on it still exists."""
    path = _cache_file()
    try:
        jars = [Path(p) for p in path.read_text().strip().split(os.pathsep) if p]
    except OSError:
        return None
    return jars if jars and all(j.is_file() for j in jars) else None


def kafka_classpath(progress: Progress | None = None) -> list[Path]:
    """The jars of Apache Kafka KAFKA_VERSION: from the cache, else resolved with `mvn`."""
    cached = cached_classpath()
    if cached is not None:
        return cached
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevStackMissing(
            "Apache Kafka's jars are resolved with Maven, and `mvn` is not on PATH. Install "
            "Maven (Debian/Ubuntu: `apt-get install maven`; macOS: `brew install maven`), or use "
            "the quick local broker: `toolledger dev up --kafka tansu`."
        )
    target = _cache_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda line: None)
    say(f"Resolving Apache Kafka {KAFKA_VERSION} with Maven (once; later starts use the cache)")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="resolve-") as work:
        (Path(work) / "pom.xml").write_text(pom_text())
        written = Path(work) / "classpath.txt"
        argv = [mvn, "-B", "-f", str(Path(work) / "pom.xml"), "dependency:build-classpath"]
        argv += [f"-Dmdep.outputFile={written}", "-Dmdep.includeScope=runtime"]
        output = _run_maven(argv, Path(work), say)
        if not written.exists():
            raise DevStackError(
                "Maven could not resolve Apache Kafka's jars (is Maven Central reachable?). "
                "Its output ends with:\n" + "\n".join(output[-20:])
            )
        os.replace(written, target)
    jars = cached_classpath()
    if jars is None:
        raise DevStackError(f"Maven wrote a classpath ({target}) naming jars that do not exist")
    say(f"Apache Kafka {KAFKA_VERSION}: {len(jars)} jars, classpath cached in {target}")
    return jars


def _run_maven(argv: list[str], cwd: Path, say: Progress) -> list[str]:
    """Run Maven, telling `say` of each jar it downloads; its output lines."""
    lines: list[str] = []
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if (found := _DOWNLOADED.search(line)) and found.group(1).endswith(".jar"):
                say(f"  downloaded {found.group(1).rsplit('/', 1)[-1]} ({found.group(2)})")
    if proc.returncode != 0:
        raise DevStackError(
            f"`mvn dependency:build-classpath` failed (exit status {proc.returncode}) while "
            "resolving Apache Kafka's jars from Maven Central. Its output ends with:\n"
            + "\n".join(lines[-20:])
        )
    return lines


def _cache_file() -> Path:
    digest = hashlib.sha256(pom_text().encode()).hexdigest()[:16]
    return cache_dir() / f"kafka-{KAFKA_VERSION}-{digest}.classpath"
