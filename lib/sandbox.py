"""
The HumanEval sandbox: runs one untrusted program (`execute`) so that it can neither reach nor harm anything outside
its own temporary directory, even as root. Layers, outermost first: a fresh `python -I -B` process with a minimal
environment, stdin closed, rlimits (CPU, address space, file size, core, processes) and a wall clock, its whole
process group killed afterwards; an audit hook (PREAMBLE) refusing writes outside, process creation, signals, ctypes,
sockets and reading other processes; below it the kernel: Landlock (ABI >= 6, else refused: read and run only the
Python installation and system libraries, write only the directory, no TCP, no signals out), PR_SET_NO_NEW_PRIVS, a
network namespace of its own (UDP reaches nothing) and a seccomp filter failing unix sockets (Landlock leaves those
named by a path open). While programs run the harness is the child subreaper, and `reap_orphans` kills what a
program leaves in a session of its own. A program passes only if it exits 0 and prints a random marker after the
test: an early exit(0) fails. Audit and test this module alone: docs/tests.md lists the hostile cases.
"""
import contextlib
import ctypes
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PREAMBLE = r'''
import os, sys
def _sandbox():
    root, me = os.path.realpath(os.getcwd()) + os.sep, str(os.getpid())
    realpath, fsdecode, fspath, PathLike = os.path.realpath, os.fsdecode, os.fspath, os.PathLike
    W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    deny = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
            "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
            "ctypes.call_function", "socket.connect", "socket.bind", "socket.sendto", "os.setuid", "os.chroot"}
    paths = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.symlink", "os.link", "os.chmod", "os.chown",
             "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree"}
    def where(p):
        return realpath(fsdecode(fspath(p))) if isinstance(p, (str, bytes, PathLike)) else None
    def outside(p):
        p = where(p)
        return p is not None and not (p + os.sep).startswith(root)
    def hook(event, args):
        if event in deny:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            if ((mode and any(c in str(mode) for c in "wax+")) or (flags or 0) & W) and outside(path):
                raise PermissionError(f"sandbox: writing outside the sandbox directory: {path!r}")
            p = where(path)
            if p and p.startswith("/proc/") and p.split("/")[2].isdigit() and p.split("/")[2] != me:
                raise PermissionError(f"sandbox: reading another process: {path!r}")
        elif event in paths and any(outside(a) for a in args):
            raise PermissionError(f"sandbox: {event} outside the sandbox directory")
    sys.addaudithook(hook)
_sandbox()
del _sandbox
'''


def count_processes(uid):
    n = 0
    for d in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if d.isdigit() and os.stat(f"/proc/{d}").st_uid == uid:
                n += 1
    return n


LANDLOCK_ABI = 6  # Linux 6.12: files, TCP bind/connect and signal scoping
LIBC = ctypes.CDLL(None, use_errno=True)
READS = (sys.prefix, sys.base_prefix, "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")  # Python, libs
FILES = {"/etc/ld.so.cache": 4, "/dev/null": 6, "/dev/urandom": 4}  # LANDLOCK_ACCESS_FS_READ_FILE 4, | WRITE_FILE 2


class PathBeneath(ctypes.Structure):  # struct landlock_path_beneath_attr
    _pack_, _fields_ = 1, [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi():
    return LIBC.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)


def landlock(sandbox):
    """A Landlock ruleset (fd) enforced by the kernel, so that no way past the audit hook (ctypes, pidfds,
    threads) leaves it: read and run only READS and FILES, read and write only `sandbox`; no TCP bind or connect;
    no signals to, and no abstract unix sockets of, processes outside. Refuses (SystemExit) where unavailable."""
    if (abi := landlock_abi()) < LANDLOCK_ABI:
        raise SystemExit(f"eval: refusing to run untrusted code: the sandbox needs Landlock ABI >= {LANDLOCK_ABI} "
                         f"(Linux 6.12+), this kernel has {abi if abi > 0 else 'none'}")
    every = (1 << 16) - 1  # every filesystem right of ABI 6 (execute ... ioctl_dev)
    attr = (ctypes.c_uint64 * 3)(every, 3, 3)  # handled: all fs rights; bind+connect TCP; scope unix + signal
    ruleset = LIBC.syscall(444, attr, ctypes.sizeof(attr), 0)
    rules = [(p, 1 | 4 | 8) for p in READS] + list(FILES.items()) + [(sandbox, every)]  # execute|read_file|read_dir
    for path, access in rules:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if LIBC.syscall(445, ruleset, 1, ctypes.byref(PathBeneath(access, fd)), 0):  # 1: a path's tree
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
    return ruleset


class SockFilter(ctypes.Structure):  # struct sock_filter: one classic-BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


# the architecture (seccomp_data.arch) and the numbers of socket(2) and socketpair(2) on it
SOCKET_SYSCALLS = {"x86_64": (0xC000003E, 41, 53), "aarch64": (0xC00000B7, 198, 199)}


def no_unix_sockets():
    """A seccomp filter (the process and all it starts) failing socket() and socketpair() for AF_UNIX with EPERM:
    Landlock ABI 6 scopes abstract unix sockets but not those named by a path, which a program could otherwise
    connect to (a local daemon). None on an architecture not listed (the audit hook still refuses sockets)."""
    if (arch := SOCKET_SYSCALLS.get(os.uname().machine)) is None:
        return None
    audit_arch, *calls = arch
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ / BPF_JGE|BPF_K, BPF_RET
    ALLOW, EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, audit_arch), (RET, 0, 0, EPERM),  # another ABI (i386): every call refused
            (LD, 0, 0, 0), (JGE, 4, 0, 0x40000000),  # x32 numbers: refused
            (JEQ, 1, 0, calls[0]), (JEQ, 0, 3, calls[1]),  # socket or socketpair, else allowed
            (LD, 0, 0, 16), (JEQ, 0, 1, 1),  # args[0] (its low word) == AF_UNIX
            (RET, 0, 0, EPERM), (RET, 0, 0, ALLOW)]
    return (SockFilter * len(prog))(*[SockFilter(*i) for i in prog])


def limiter(cpu_s, mem_mb, fsize_mb, nproc, ruleset):
    def set_limits():  # runs in the child between fork and exec
        for lim, v in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, mem_mb << 20),
                       (resource.RLIMIT_FSIZE, fsize_mb << 20), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_NPROC, nproc)):
            resource.setrlimit(lim, (v, v))
        # a network namespace of its own (as root; else in a user namespace too), with no interface but a loopback
        # that is down: UDP, which Landlock leaves open, reaches nothing outside
        if LIBC.unshare(0x40000000) and LIBC.unshare(0x10000000 | 0x40000000):  # CLONE_NEWNET, | CLONE_NEWUSER
            raise OSError(ctypes.get_errno(), "sandbox: no network namespace")
        # PR_SET_NO_NEW_PRIVS (no setuid gains), then landlock_restrict_self: for this process and all it starts
        if LIBC.prctl(38, 1, 0, 0, 0) or LIBC.syscall(446, ruleset, 0):
            raise OSError(ctypes.get_errno(), "sandbox: landlock_restrict_self failed")  # Popen fails: never unconfined
        if unix is not None and LIBC.prctl(22, 2, ctypes.byref(SockFprog(len(unix), unix)), 0, 0):  # SECCOMP filter
            raise OSError(ctypes.get_errno(), "sandbox: the seccomp filter failed")
    unix = no_unix_sockets()  # built before the fork
    return set_limits


PROGRAMS, PROGRAMS_LOCK = set(), threading.Lock()  # the sandboxed programs running now: this process's children


@contextlib.contextmanager
def subreaper():
    """While inside, this process is the child subreaper (PR_SET_CHILD_SUBREAPER): a descendant a program leaves
    behind (in a session of its own, which the group kill misses) is reparented here, not to init, for
    reap_orphans to find."""
    LIBC.prctl(36, 1, 0, 0, 0)
    try:
        yield
    finally:
        LIBC.prctl(36, 0, 0, 0, 0)


def reap_orphans():
    """Kill and reap every child of this process that lives in another network namespace and is not a running
    program: what a program left behind (each program has a namespace of its own; nothing else here does), again
    until none is left, as its own children are reparented here in turn. Call with PROGRAMS_LOCK held."""
    here = os.readlink("/proc/self/ns/net")
    for _ in range(1000):
        kids = set()
        for t in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                kids |= {int(x) for x in Path(f"/proc/self/task/{t}/children").read_text().split()}
        left = []
        for pid in kids - PROGRAMS:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/net") != here:
                    left.append(pid)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def execute(program, timeout=5.0, mem_mb=1024, fsize_mb=16, nproc=None, cap=4096):
    """Run one untrusted program (text) in a sandbox -> dict(passed, status, output). The program passes when it
    exits 0 and its last output line is the marker, which is appended here after the program text."""
    marker = "PASSED-" + secrets.token_hex(16)
    nproc = nproc or count_processes(os.getuid()) + 64  # NPROC counts all the user's processes (root: ignored)
    with tempfile.TemporaryDirectory(prefix="eval-sandbox-") as d:
        src, out = Path(d, "program.py"), Path(d, "output.txt")
        src.write_text(PREAMBLE + program + f"\n\nprint({marker!r}, flush=True)\n")
        ruleset = landlock(d)
        with open(out, "wb") as f:
            try:
                with PROGRAMS_LOCK:  # known as a program before any sweep can see it
                    proc = subprocess.Popen([sys.executable, "-I", "-B", str(src)], cwd=d, stdin=subprocess.DEVNULL,
                                            stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
                                            preexec_fn=limiter(int(timeout) + 1, mem_mb, fsize_mb, nproc, ruleset))
                    PROGRAMS.add(proc.pid)
            finally:
                os.close(ruleset)
            try:
                rc, status = proc.wait(timeout), None
            except subprocess.TimeoutExpired:
                rc, status = None, "timed out"
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole group, even after a normal exit
                proc.wait()
                with PROGRAMS_LOCK:
                    PROGRAMS.discard(proc.pid)
                    reap_orphans()  # under subreaper(): what left the group (a session of its own) dies too
        size = out.stat().st_size
        with open(out, "rb") as f:
            head = f.read(cap)
            f.seek(max(0, size - 256))
            tail = f.read()
    passed = rc == 0 and tail.decode(errors="replace").rstrip().endswith(marker)
    text = head.decode(errors="replace").replace(marker, "<marker>")
    status = status or ("passed" if passed else f"failed (exit {rc})" + (": marker missing" if rc == 0 else ""))
    return dict(passed=passed, status=status, output=text[-1000:])
