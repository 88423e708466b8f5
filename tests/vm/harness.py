"""Run commands (above all pytest selections) inside a small VM whose kernel has IPVS.

This machine's kernel has no ``ip_vs`` and no ``dummy``, so IPVS is tested in qemu (TCG: KVM
does not work here) booting Debian's ``linux-image-cloud-amd64`` kernel with a busybox
initramfs. The host's root is shared read-only over virtiofs, so the guest runs the very
checkout and virtualenv of the caller; a second, writable virtiofs share of a temporary
directory carries the jobs in and the results (exit status, output, JUnit XML) back out.
``/work/shared/notes/ipvs-vm.md`` has the recipe and its pitfalls.

Everything comes from Debian packages (``scripts/setup`` installs them and runs
``harness.py prepare``). The kernel is unpacked into ``CACHE/<kernel version>/`` outside the
checkout, next to the initramfs built for it; both are made on first use if missing.

    from tests.vm.harness import Job, run_jobs
    [result] = run_jobs([Job.pytest(["tests/vm/inner", "-q"])])
    assert result.passed, result.report()

Or from a shell: ``.venv/bin/python tests/vm/harness.py pytest tests/vm/inner -q``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LACE_PROXY_VM_CACHE", "/var/cache/lace-proxy/vm"))
KERNEL_PACKAGE = "linux-image-cloud-amd64"
#: Seconds one boot may take, jobs included, before qemu is killed.
DEFAULT_TIMEOUT = 300.0
MEMORY_MB = 1024
GUEST_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
#: Loaded at boot: virtiofs to reach the root, then what the tests need. The rest of the
#: module trees below are in the initramfs too, for the kernel's autoloader (nft expressions).
BOOT_MODULES = (
    "virtio_pci",
    "virtiofs",
    "overlay",
    "virtio_rng",
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_sh",
    "ip_vs_mh",
    "dummy",
    "veth",
    "bridge",
    "nf_tables",
    "nf_conntrack",
    "nf_nat",
)
#: Module files (prefixes of paths in lib/modules/<ver>/) copied into the initramfs, with
#: everything they depend on. Not the whole 90 MB tree: the guest would load it into RAM.
MODULE_TREES = (
    "kernel/net/netfilter/",
    "kernel/net/ipv4/",
    "kernel/net/ipv6/",
    "kernel/net/bridge/",
    "kernel/net/8021q/",
    "kernel/net/sched/",
    "kernel/fs/fuse/",
    "kernel/fs/overlayfs/",
    "kernel/drivers/virtio/",
    "kernel/drivers/char/hw_random/virtio-rng.ko",
    "kernel/drivers/net/dummy.ko",
    "kernel/drivers/net/veth.ko",
)

# PID 1 in the guest. It stays in the initramfs (the kernel's module autoloader runs
# /sbin/modprobe from there) and runs the job runner chrooted into the host's root, with the
# writable job share on /run/lace-vm-job (under the guest's own /run, a tmpfs).
# lace_python and lace_runner come from the kernel command line (the kernel hands unknown
# name=value parameters to init as environment variables).
INIT_SCRIPT = r"""#!/bin/sh
export PATH=/bin
fail() { echo "lace-vm: FAILED: $*"; poweroff -f; }
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev || fail mounts
echo "lace-vm: init"
for m in $(cat /etc/lace-vm-modules); do modprobe "$m" || fail "modprobe $m"; done
R=/newroot
mount -t virtiofs -o ro hostroot $R || fail "mount hostroot"
# /tmp: writable, yet showing the host's (a checkout or virtualenv may live there).
mkdir -p /tmpfs && mount -t tmpfs -o mode=755 tmpfs /tmpfs && mkdir /tmpfs/up /tmpfs/work \
    && chmod 1777 /tmpfs/up || fail "tmpfs for /tmp"
mount -t overlay -o lowerdir=$R/tmp,upperdir=/tmpfs/up,workdir=/tmpfs/work tmp $R/tmp \
    || fail "mount /tmp"
mount -t tmpfs -o mode=755 run $R/run || fail "mount /run"
mkdir -p $R/run/netns $R/run/lace-vm-job
mount -t virtiofs lacejob $R/run/lace-vm-job || fail "mount job share"
mount -t proc proc $R/proc && mount -t sysfs sys $R/sys && mount -t devtmpfs dev $R/dev \
    || fail "mount proc, sys, dev"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts && mount -t tmpfs -o mode=1777 shm $R/dev/shm \
    || fail "mount /dev/pts, /dev/shm"
ip link set lo up || fail "loopback"
echo "lace-vm: running"
chroot $R "$lace_python" "$lace_runner" guest /run/lace-vm-job
echo "lace-vm: runner exited $?"
sync
poweroff -f
"""

_MARK_RUNNING = "lace-vm: running"
_MARK_FAILED = "lace-vm: FAILED"
_CONSOLE_LIMIT = 1 << 20


class VmUnavailable(Exception):
    """The VM cannot start on this machine at all (the only reason to skip VM tests)."""


class VmError(Exception):
    """The VM started but did not deliver results: boot failure, timeout, crashed runner."""


@dataclass(frozen=True)
class Kernel:
    """An unpacked kernel package in the cache."""

    version: str  # "6.1.0-57-cloud-amd64": also its lib/modules directory name
    root: Path

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.version


@dataclass
class Job:
    """One command for the guest's runner. ``cwd`` and ``argv[0]`` are host paths."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = str(REPO)
    junit: bool = False  # the runner appends --junitxml=<this job's result dir>/junit.xml

    @classmethod
    def pytest(cls, args: Sequence[str], env: Mapping[str, str] | None = None) -> Job:
        """A pytest run in the guest with this interpreter; results also as JUnit XML.

        No cache provider and no bytecode: the checkout is read-only in the guest.
        """
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
        return cls(argv, dict(env or {}), junit=True)


@dataclass
class JUnit:
    tests: int
    failures: int
    errors: int
    skipped: int


@dataclass
class VmResult:
    """What one job did in the guest, and how the boot that ran it went."""

    argv: list[str]
    returncode: int
    output: str = field(repr=False)  # stdout and stderr together
    seconds: float  # the job alone, measured in the guest
    junit: JUnit | None
    boot_seconds: float  # host: start -> runner started in the guest
    total_seconds: float  # host: the whole VM run, every job of it included
    console: str = field(repr=False)

    @property
    def passed(self) -> bool:
        return self.returncode == 0

    def report(self) -> str:
        """For assertion messages: what ran, how it ended and its whole output."""
        counts = ""
        if (j := self.junit) is not None:
            counts = (
                f", {j.tests} tests: {j.failures} failed, {j.errors} errors, {j.skipped} skipped"
            )
        return (
            f"in the VM: {' '.join(self.argv)}\nexit status {self.returncode}{counts} "
            f"({self.seconds:.1f} s; boot {self.boot_seconds:.1f} s)\n"
            f"--- output ---\n{self.output}--- end of output ---"
        )


def _run(argv: Sequence[str | os.PathLike[str]], **kwargs: object) -> str:
    proc = subprocess.run(
        [os.fspath(a) for a in argv], capture_output=True, text=True, check=False, **kwargs
    )
    if proc.returncode != 0:
        raise VmUnavailable(
            f"{' '.join(map(str, argv))} failed ({proc.returncode}): {proc.stderr.strip()}"
        )
    return proc.stdout


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """Serialize fetching and building: two pytest runs may start at once."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _apt_download(spec: str, dest: Path) -> Path:
    """`apt-get download` into dest, updating the package lists once if they are stale."""
    # As root apt downloads as _apt, who cannot write into a private temporary directory.
    argv = ["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", spec]
    try:
        _run(argv, cwd=dest)
    except VmUnavailable:
        _run(["apt-get", "update", "-qq"])
        _run(argv, cwd=dest)
    name = spec.partition("=")[0]
    [deb] = dest.glob(f"{name}_*.deb")
    return deb


def cached_kernel(cache: Path = CACHE) -> Kernel | None:
    """The most recently fetched complete kernel in the cache, if any."""
    done = sorted(cache.glob("*/.complete"), key=lambda p: p.stat().st_mtime)
    return Kernel(done[-1].parent.name, done[-1].parent) if done else None


def fetch_kernel(cache: Path = CACHE) -> Kernel:
    """Download the current cloud kernel (the metapackage, then the versioned package its
    Depends names) and unpack it into the cache, unless that version is there already."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise VmUnavailable("cannot fetch the VM kernel: apt-get or dpkg-deb missing")
    with _locked(cache):
        for stale in cache.glob(".fetch-*"):  # left by a killed run: nobody else holds the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache))
        try:
            meta = _apt_download(KERNEL_PACKAGE, tmp)
            depends = _run(["dpkg-deb", "-f", meta, "Depends"]).strip()
            m = re.fullmatch(r"(linux-image-(\S+))\s+\(=\s*(\S+)\)", depends)
            if m is None:
                raise VmUnavailable(f"{KERNEL_PACKAGE} depends on {depends!r}: no kernel")
            package, version, package_version = m.groups()
            kernel = Kernel(version, cache / version)
            if (kernel.root / ".complete").exists():
                return kernel
            deb = _apt_download(f"{package}={package_version}", tmp)
            unpacked = tmp / "root"
            _run(["dpkg-deb", "-x", deb, unpacked])
            # modules.dep for the whole tree: the initramfs takes a subset and its deps.
            _run(["depmod", "-b", unpacked, version])
            shutil.rmtree(kernel.root, ignore_errors=True)
            unpacked.rename(kernel.root)
            (kernel.root / ".complete").write_text(f"{package}={package_version}\n")
            return kernel
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _busybox() -> Path:
    path = shutil.which("busybox") or "/bin/busybox"
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"/ld-linux" in head:  # an ELF interpreter: dynamically linked, useless in the initramfs
        raise VmUnavailable(f"{path} is not static: install busybox-static")
    return Path(path)


def _module_closure(modules: Path) -> list[str]:
    """The files under MODULE_TREES and every module they need (from modules.dep)."""
    deps: dict[str, list[str]] = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        name, _, needs = line.partition(":")
        deps[name] = needs.split()
    todo = [name for name in deps if name.startswith(MODULE_TREES)]
    chosen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in chosen:
            chosen.add(name)
            todo.extend(deps[name])
    return sorted(chosen)


def build_initramfs(kernel: Kernel) -> Path:
    """The initramfs for this kernel: built once, cached next to it.

    Its name carries a hash of what goes in (init script, module lists, busybox), so a change
    to any of them builds a new one instead of booting a stale one. Others stay (another
    checkout may be booting one) until ``prepare --prune``.
    """
    busybox = _busybox()
    if shutil.which("cpio") is None or shutil.which("depmod") is None:
        raise VmUnavailable("building the VM initramfs needs cpio and depmod (kmod)")
    digest = hashlib.sha256()
    for part in (INIT_SCRIPT, repr(BOOT_MODULES), repr(MODULE_TREES), kernel.version):
        digest.update(part.encode())
    digest.update(busybox.read_bytes())
    image = kernel.root / f"initramfs-{digest.hexdigest()[:12]}.cpio"
    if image.exists():
        return image
    with _locked(kernel.root.parent):
        if image.exists():
            return image
        for stale in kernel.root.glob(".initramfs-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=".initramfs-", dir=kernel.root))
        try:
            _stage_initramfs(staging, kernel, busybox)
            names = sorted(str(p.relative_to(staging)) for p in staging.rglob("*"))
            partial = image.with_suffix(".partial")
            with open(partial, "wb") as out:
                subprocess.run(
                    ["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"],
                    input="\n".join(names).encode(),
                    stdout=out,
                    cwd=staging,
                    check=True,
                )
            partial.rename(image)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return image


def _stage_initramfs(staging: Path, kernel: Kernel, busybox: Path) -> None:
    for d in ("bin", "dev", "etc", "proc", "sys", "newroot"):
        (staging / d).mkdir()
    os.symlink("bin", staging / "sbin")  # the autoloader calls /sbin/modprobe
    shutil.copy2(busybox, staging / "bin" / "busybox")
    for applet in _run([busybox, "--list"]).split():
        if applet != "busybox":
            os.symlink("busybox", staging / "bin" / applet)
    os.mknod(staging / "dev" / "console", 0o600 | stat.S_IFCHR, os.makedev(5, 1))
    init = staging / "init"
    init.write_text(INIT_SCRIPT)
    init.chmod(0o755)
    (staging / "etc" / "lace-vm-modules").write_text("\n".join(BOOT_MODULES) + "\n")
    target = staging / "lib" / "modules" / kernel.version
    for name in _module_closure(kernel.modules):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kernel.modules / name, target / name)
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        shutil.copy2(kernel.modules / name, target / name)
    _run(["depmod", "-b", staging, kernel.version])


def _tool(names: Sequence[str], package: str) -> str:
    for name in names:
        found = shutil.which(name) or (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    raise VmUnavailable(f"{names[0]} not found: install {package}")


def prepare(cache: Path = CACHE, *, refresh: bool = False) -> tuple[Kernel, Path]:
    """Kernel and initramfs, fetched and built if missing (with ``refresh``: if outdated).

    Raises VmUnavailable when the VM cannot start here at all.
    """
    if os.geteuid() != 0:
        raise VmUnavailable("the IPVS VM needs root (virtiofsd shares the host's root)")
    _tool(["qemu-system-x86_64"], "qemu-system-x86")
    _virtiofsd()
    kernel = None if refresh else cached_kernel(cache)
    if kernel is None:
        kernel = fetch_kernel(cache)
    return kernel, build_initramfs(kernel)


def _virtiofsd() -> str:
    # Bookworm's qemu-system-common ships the C virtiofsd; later releases a package.
    return _tool(
        ["/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd", "virtiofsd"],
        "virtiofsd (on Debian 12: qemu-system-x86)",
    )


def _guest_env(job: Job) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith("LACE_PROXY_")}
    env.pop("LACE_PROXY_VM_CACHE", None)
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), *GUEST_PATH]),
        HOME="/tmp",
        LANG="C.UTF-8",
        PYTHONDONTWRITEBYTECODE="1",
        LACE_PROXY_IN_VM="1",
    )
    env.update(job.env)
    return env


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, even by SIGKILL, so no qemu or
    virtiofsd outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawn(argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
    # Own process group: Ctrl-C reaches pytest alone, which then stops these in order.
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=_die_with_parent, **kwargs
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for(paths: Sequence[Path], procs: Sequence[subprocess.Popen[bytes]], deadline: float):
    while not all(p.exists() for p in paths):
        for proc in procs:
            if proc.poll() is not None:
                raise VmError(f"virtiofsd exited ({proc.returncode}) before listening")
        if time.monotonic() > deadline:
            raise VmError("virtiofsd did not create its socket in time")
        time.sleep(0.01)


def _remove_stale_workdirs() -> None:
    """Temporary directories of runs whose process was killed before it could clean up (its
    qemu and virtiofsd died with it: see _die_with_parent)."""
    for work in Path(tempfile.gettempdir()).glob("lace-vm-*-*"):
        pid = work.name.split("-")[2]
        if pid.isdigit() and not Path("/proc", pid).exists():
            shutil.rmtree(work, ignore_errors=True)


def run_jobs(jobs: Sequence[Job], *, timeout: float = DEFAULT_TIMEOUT) -> list[VmResult]:
    """Boot the VM once, run the jobs one after another in it, and power it off.

    A job that fails is a result (its returncode); a VM that does not come up, hangs past
    ``timeout`` seconds or loses results raises VmError with the console; one that cannot
    start at all raises VmUnavailable. qemu and both virtiofsd are stopped and the temporary
    directory removed on every way out, Ctrl-C included.
    """
    kernel, initramfs = prepare()
    virtiofsd = _virtiofsd()
    start = time.monotonic()
    deadline = start + timeout
    _remove_stale_workdirs()
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix=f"lace-vm-{os.getpid()}-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        share = work / "job"
        share.mkdir()
        spec = [dict(vars(job), env=_guest_env(job)) for job in jobs]
        (share / "jobs.json").write_text(json.dumps(spec))
        log = stack.enter_context(open(work / "virtiofsd.log", "wb"))
        daemons = []
        for tag, source, cache in (("hostroot", "/", "always"), ("lacejob", share, "none")):
            options = f"source={source},cache={cache},sandbox=chroot,log_level=warn"
            daemon = _spawn(
                [virtiofsd, f"--socket-path={work / tag}.sock", "-o", options],
                stdout=log,
                stderr=log,
            )
            stack.callback(_stop, daemon)
            daemons.append(daemon)
        _wait_for([work / "hostroot.sock", work / "lacejob.sock"], daemons, deadline)
        cmdline = [
            "console=ttyS0",
            "quiet",
            "panic=-1",
            f"lace_python={sys.executable}",
            f"lace_runner={Path(__file__).resolve()}",
        ]
        qemu = [
            "qemu-system-x86_64",
            "-accel", "tcg",
            "-m", f"{MEMORY_MB}M",
            "-smp", "1",  # measured: a second vCPU only slows TCG down on two host cores
            "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
            "-serial", "stdio",
            "-kernel", str(kernel.vmlinuz),
            "-initrd", str(initramfs),
            "-append", " ".join(cmdline),
            "-object", f"memory-backend-memfd,id=mem,size={MEMORY_MB}M,share=on",
            "-numa", "node,memdev=mem",
            "-device", "virtio-rng-pci",
        ]  # fmt: skip
        for tag in ("hostroot", "lacejob"):
            qemu += ["-chardev", f"socket,id={tag},path={work / tag}.sock"]
            qemu += ["-device", f"vhost-user-fs-pci,queue-size=1024,chardev={tag},tag={tag}"]
        vm = _spawn(qemu, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        stack.callback(_stop, vm)
        console, booted = _read_console(vm, start, deadline)
        total = time.monotonic() - start

        def failure(why: str) -> VmError:
            logged = (work / "virtiofsd.log").read_text(errors="replace")
            extra = f"\n--- virtiofsd ---\n{logged}" if logged.strip() else ""
            return VmError(f"{why}\n--- VM console ---\n{console}--- end of console ---{extra}")

        if vm.poll() is None:
            raise failure(f"the VM did not finish within {timeout:.0f} s: killed")
        if booted is None or _MARK_FAILED in console:
            raise failure(f"the VM did not boot (qemu exited {vm.returncode})")
        results = []
        for i, job in enumerate(jobs):
            out = share / str(i)
            try:
                status = json.loads((out / "result.json").read_text())
                output = (out / "output.txt").read_text(errors="replace")
            except (OSError, ValueError) as exc:
                raise failure(f"no result for job {i} ({' '.join(job.argv)}): {exc}") from None
            junit = _junit(out / "junit.xml") if job.junit else None
            results.append(
                VmResult(
                    argv=job.argv,
                    returncode=status["returncode"],
                    output=output,
                    seconds=status["seconds"],
                    junit=junit,
                    boot_seconds=booted,
                    total_seconds=total,
                    console=console,
                )
            )
        return results


def _read_console(
    vm: subprocess.Popen[bytes], start: float, deadline: float
) -> tuple[str, float | None]:
    """The console until qemu exits or the deadline, and when the runner started."""
    assert vm.stdout is not None
    fd = vm.stdout.fileno()
    chunks: list[bytes] = []
    size = 0
    booted = None
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if size < _CONSOLE_LIMIT:
            chunks.append(chunk)
            size += len(chunk)
        # Markers may arrive split over reads or prefixed by terminal escapes: search it all.
        if booted is None and _MARK_RUNNING.encode() in b"".join(chunks):
            booted = time.monotonic() - start
    if time.monotonic() < deadline:
        vm.wait(timeout=max(deadline - time.monotonic(), 0.1))
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return text, booted


def _junit(path: Path) -> JUnit | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    keys = ("tests", "failures", "errors", "skipped")
    return JUnit(*(sum(int(s.get(k, 0)) for s in suites) for k in keys))


def _guest(share: Path) -> int:
    """In the guest (chrooted into the host's root): run each job, save its results."""
    for i, job in enumerate(json.loads((share / "jobs.json").read_text())):
        out = share / str(i)
        out.mkdir()
        argv = job["argv"] + ([f"--junitxml={out / 'junit.xml'}"] if job["junit"] else [])
        print(f"lace-vm: job {i}: {' '.join(argv)}", flush=True)
        start = time.monotonic()
        with open(out / "output.txt", "wb") as output:
            try:
                returncode = subprocess.run(
                    argv, env=job["env"], cwd=job["cwd"], stdin=subprocess.DEVNULL,
                    stdout=output, stderr=subprocess.STDOUT, check=False,
                ).returncode  # fmt: skip
            except OSError as exc:
                output.write(f"lace-vm: cannot run {argv[0]}: {exc}\n".encode())
                returncode = 127
        seconds = time.monotonic() - start
        (out / "result.json").write_text(json.dumps({"returncode": returncode, "seconds": seconds}))
        print(f"lace-vm: job {i} exited {returncode} after {seconds:.1f} s", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="fetch the current kernel and build its initramfs")
    p.add_argument("--prune", action="store_true", help="remove other cached kernels")
    for name, what in (("pytest", "run pytest with these arguments"), ("run", "run this command")):
        p = sub.add_parser(name, help=f"{what} in the VM")
        p.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            help=f"seconds before the VM is killed (default {DEFAULT_TIMEOUT:g})",
        )
        p.add_argument("args", nargs=argparse.REMAINDER)
    p = sub.add_parser("guest", help=argparse.SUPPRESS)
    p.add_argument("share", type=Path)
    args = parser.parse_args(argv)
    if args.command == "guest":
        return _guest(args.share)
    try:
        if args.command == "prepare":
            start = time.monotonic()
            kernel, initramfs = prepare(refresh=True)
            if args.prune:
                for other in CACHE.iterdir():
                    if other.is_dir() and other != kernel.root and not other.name.startswith("."):
                        shutil.rmtree(other)
                for other in kernel.root.glob("initramfs-*.cpio"):
                    if other != initramfs:
                        other.unlink()
            took = time.monotonic() - start
            print(f"vm: kernel {kernel.version}, {initramfs.name} ({took:.1f} s)")
            return 0
        job = Job.pytest(args.args) if args.command == "pytest" else Job(args.args)
        [result] = run_jobs([job], timeout=args.timeout)
    except (VmUnavailable, VmError) as exc:
        print(f"vm: {exc}", file=sys.stderr)
        return 2
    print(result.output, end="")
    took = f"boot {result.boot_seconds:.1f} s, job {result.seconds:.1f} s"
    print(f"vm: {took}, total {result.total_seconds:.1f} s")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
