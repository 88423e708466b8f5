"""Build kube-apiserver, kube-proxy and etcd from the Go module proxy, once per version.

The two Go modules beside this file pin the versions (``kube/go.mod``: k8s.io/kubernetes with
every staging module replaced by its published release; ``etcd/go.mod``: etcd's server). The
binaries land in a cache outside the repository, keyed by both versions and a hash of the
modules and of this build recipe, so a second run builds nothing. Go's own module and build
caches live beside it, also outside the repository.

    python -m testkit.controlplane.build           # build if needed, print the bin directory
    python -m testkit.controlplane.build --check   # exit 1 if not built (builds nothing)

A cold build takes about 10 minutes on 2 cores and peaks near 2.3 GiB RSS (kube-apiserver);
everything runs under ``nice``/``ionice`` so it does not disturb timing-sensitive tests.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KUBE_MODULE = HERE / "kube"
ETCD_MODULE = HERE / "etcd"
#: Override with LACE_PROXY_CACHE (tox passes LACE_PROXY_* through).
CACHE_ROOT = Path(os.environ.get("LACE_PROXY_CACHE", "/var/cache/lace-proxy"))
#: Bump when the build flags below change, so old binaries are not taken for new ones.
RECIPE = "2"
#: Go's `go` directive of both modules; Debian's golang-go is far older, so say so early.
MIN_GO = (1, 26)


@dataclass(frozen=True)
class Binaries:
    """Paths of the three built programs and the versions they were built at."""

    directory: Path
    kubernetes_version: str
    etcd_version: str

    @property
    def kube_apiserver(self) -> Path:
        return self.directory / "kube-apiserver"

    @property
    def kube_proxy(self) -> Path:
        return self.directory / "kube-proxy"

    @property
    def etcd(self) -> Path:
        return self.directory / "etcd"


def _required(go_mod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.M)
    if match is None:
        raise RuntimeError(f"{go_mod} does not require {module}")
    return match.group(1)


def _key() -> tuple[str, str, str]:
    """(kubernetes version, etcd version, cache key): the key changes with any pin."""
    kube = _required(KUBE_MODULE / "go.mod", "k8s.io/kubernetes")
    etcd = _required(ETCD_MODULE / "go.mod", "go.etcd.io/etcd/server/v3")
    digest = hashlib.sha256(RECIPE.encode())
    for module in (KUBE_MODULE, ETCD_MODULE):
        for name in ("go.mod", "go.sum", "main.go"):
            path = module / name
            digest.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b""))
    return kube, etcd, digest.hexdigest()[:12]


def binaries() -> Binaries:
    """Where the binaries for the pinned versions live (built or not)."""
    kube, etcd, digest = _key()
    directory = CACHE_ROOT / "controlplane" / f"{kube}-{etcd}-{digest}" / "bin"
    return Binaries(directory, kube, etcd)


def is_built(bins: Binaries | None = None) -> bool:
    bins = bins or binaries()
    return (bins.directory / ".complete").exists()


def find_go() -> str | None:
    """`go` on PATH, else the official tarball's place (tox and sudo may trim PATH)."""
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    return found


def _kube_ldflags(version: str, build_date: str) -> str:
    """What upstream's hack/lib/version.sh stamps; without it they report v0.0.0-master."""
    major, minor = re.match(r"v(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            # upstream's word for a build from a source archive rather than a git checkout
            f"-X {package}.gitTreeState=archive",
            f"-X {package}.gitCommit=",  # unknown from the module proxy; else "$Format:%H$"
            f"-X {package}.buildDate={build_date}",
        ]
    return " ".join(flags)


def _release_date(go: str, env: dict[str, str], version: str) -> str:
    """The module's publication time: a fixed buildDate keeps builds reproducible."""
    out = subprocess.run(
        [go, "list", "-m", "-f", "{{.Time.UTC.Format \"2006-01-02T15:04:05Z\"}}",
         f"k8s.io/kubernetes@{version}"],
        cwd=KUBE_MODULE, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    date = out.stdout.strip() if out.returncode == 0 else ""
    return date or "1970-01-01T00:00:00Z"


def _polite() -> list[str]:
    """Lowest CPU and I/O priority: other engineers run timing-sensitive tests here."""
    prefix = ["nice", "-n", "19"]
    if shutil.which("ionice"):
        prefix += ["ionice", "-c3"]
    return prefix


def _go_env(go: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(CACHE_ROOT / "go" / "mod"),
        GOCACHE=str(CACHE_ROOT / "go" / "build"),
        GOTOOLCHAIN="local",  # never fetch another toolchain behind our back
        GOFLAGS="-mod=readonly -buildvcs=false",  # the committed go.sum is the truth
        CGO_ENABLED="0",  # as upstream builds both programs: static, no libc
    )
    version = subprocess.run(
        [go, "env", "GOVERSION"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    found = re.match(r"go(\d+)\.(\d+)", version)
    if found is None or tuple(map(int, found.groups())) < MIN_GO:
        raise RuntimeError(
            f"{go} is {version}; the control plane needs Go >= {'.'.join(map(str, MIN_GO))}"
        )
    return env


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    started = time.monotonic()
    print(f"build: go build {command[-1]}  (in {cwd.name}/)", flush=True)
    subprocess.run(_polite() + command, cwd=cwd, env=env, check=True)
    print(f"build:   {time.monotonic() - started:.0f} s", flush=True)


def build(force: bool = False) -> Binaries:
    """Build the three binaries unless the cache already holds them; return their paths."""
    bins = binaries()
    if not force and is_built(bins):
        print(f"build: cached: {bins.directory}", flush=True)
        return bins
    go = find_go()
    if go is None:
        raise RuntimeError("no `go` found: the control plane is built with Go >= 1.26")
    env = _go_env(go)
    for name in ("mod", "build"):
        (CACHE_ROOT / "go" / name).mkdir(parents=True, exist_ok=True)
    bins.directory.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (two test sessions may start together); the loser waits, then
    # finds the binaries in place.
    with open(bins.directory.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_built(bins):
            print(f"build: cached: {bins.directory}", flush=True)
            return bins
        started = time.monotonic()
        staging = bins.directory.with_name("bin.partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        ldflags = _kube_ldflags(
            bins.kubernetes_version, _release_date(go, env, bins.kubernetes_version)
        )
        for command in ("kube-apiserver", "kube-proxy"):
            _run(
                [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(staging / command),
                 f"k8s.io/kubernetes/cmd/{command}"],
                KUBE_MODULE, env,
            )  # fmt: skip
        _run([go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "etcd"), "."],
             ETCD_MODULE, env)  # fmt: skip
        shutil.rmtree(bins.directory, ignore_errors=True)
        staging.rename(bins.directory)
        (bins.directory / ".complete").write_text(
            f"{bins.kubernetes_version} {bins.etcd_version}\n"
        )
        print(f"build: built in {time.monotonic() - started:.0f} s: {bins.directory}", flush=True)
    return bins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="build nothing; exit 1 if not built")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    if args.check:
        bins = binaries()
        print(bins.directory if is_built(bins) else f"not built: {bins.directory}")
        return 0 if is_built(bins) else 1
    try:
        build(force=args.force)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"build: failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
