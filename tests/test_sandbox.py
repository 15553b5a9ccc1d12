"""lib.sandbox, the HumanEval harness's sandbox: canonical solutions pass and empty ones fail through eval.py humaneval;
an early exit(0) does not pass; every hostile completion (writing, reading, connecting, signalling, forking,
escaping the group, ...) is contained, with the audit hook and with the kernel's layers alone."""
import json
import os
import subprocess
import sys
import time

import pytest

import eval as E
from conftest import ROOT, run_script
from lib import sandbox

needs_landlock = pytest.mark.skipif(sandbox.landlock_abi() < sandbox.LANDLOCK_ABI,
                                    reason="the sandbox needs Landlock, Linux 6.12+")


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@needs_landlock
def test_canonical_solutions_pass_and_empty_fail(tmp_path):
    probs = E.problems()
    assert len(probs) == 164
    canon = write_jsonl(tmp_path / "c.jsonl", [dict(task_id=t, completion=p["canonical_solution"])
                                               for t, p in probs.items()])
    t0 = time.time()
    r = run_script("eval.py", "humaneval", "--completions", canon, "--workers", "2", "--out", tmp_path / "c.json")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "c.json").read_text())["results"]
    assert res["pass@1"] == 1.0 and res["problems"] == 164, [s for s in res["samples"] if not s["passed"]][:3]
    print(f"canonical solutions: 164 programs in {time.time() - t0:.1f} s with 2 workers")
    empty = write_jsonl(tmp_path / "e.jsonl", [dict(task_id=t, completion="") for t in list(probs)[:5]] * 2)
    r = run_script("eval.py", "humaneval", "--completions", empty, "--limit", "5", "--out", tmp_path / "e.json")
    res = json.loads((tmp_path / "e.json").read_text())["results"]
    assert r.returncode == 0 and res["pass@1"] == 0.0 and res["programs"] == 10


@needs_landlock
def test_early_exit_does_not_pass():
    ok = "print('fine')\n"
    assert sandbox.execute(ok)["passed"]
    for bad in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "raise SystemExit\n"):
        res = sandbox.execute(bad)
        assert not res["passed"] and res["status"].startswith("failed (exit 0)"), res


# the kernel's part alone: eval.py humaneval with the audit hook blanked
HOOKLESS = "import sys, eval as E; from lib import sandbox; sandbox.PREAMBLE = ''; sys.argv[0] = 'eval.py'; E.main()"


@needs_landlock
@pytest.mark.parametrize("hook", [True, False], ids=["audit hook", "no audit hook"])
def test_hostile_completions_are_contained(tmp_path, hook):
    """Run in a throwaway harness process (so that a completion that kills its parent's parent could only
    kill that one): every hostile completion fails, in bounded time, nothing appears outside the sandboxes,
    nothing outside is read, no secret leaks and no sandboxed process survives. The harness makes its sandboxes
    under this test's own directory (TMPDIR), so that the escape and survivor checks see this run alone, not the
    machine's other runs. Without the audit hook (as if a program got past it) Landlock alone must hold; there
    the completions that fork are left out (as root nothing bounds a fork bomb but the wall clock)."""
    import socket
    prob = E.problems(1)["HumanEval/0"]
    good = prob["canonical_solution"]
    outside = tmp_path / "outside"
    outside.mkdir()
    home = tmp_path / "home"  # stands in for the home directory and the project's checkpoints
    home.mkdir()
    (home / "secret.txt").write_text("s3cr3t-file")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    unix = socket.socket(socket.AF_UNIX)  # a local daemon's socket, named by a path outside the sandbox
    unix.bind(str(tmp_path / "daemon.sock"))
    unix.listen()
    unix.setblocking(False)
    def top(code):
        return good + "\n" + code + "\n"  # after the (correct) function, at module level
    libc = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    def must(call):
        return f"assert {call} >= 0, os.strerror(ctypes.get_errno())"  # a refused call fails the program
    hostile = {
        "read outside": top(f"print(open({str(home / 'secret.txt')!r}).read())"),
        "list outside": top(f"import os\nprint(os.listdir({str(home)!r}))"),
        "tcp connect": top(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"),
        "udp send": top(f"import socket\nsocket.socket(2, 2).sendto(b'x', ('127.0.0.1', {udp.getsockname()[1]}))"),
        "unix connect": top(f"import socket\nsocket.socket(socket.AF_UNIX).connect({str(tmp_path / 'daemon.sock')!r})"),
        "ctypes unix connect": top(libc + "s = libc.socket(1, 1, 0)\n" + must("s") + "\nimport struct\n"
                                   + f"a = struct.pack('=H', 1) + {str(tmp_path / 'daemon.sock').encode()!r}\n"
                                   + "a = a + bytes(110 - len(a))\n" + must("libc.connect(s, a, len(a))")),
        "pidfd signal": top("import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)"),
        "ctypes kill": top(libc + must("libc.kill(os.getppid(), 9)")),
        "ctypes read": top(libc + f"fd = libc.open({str(home / 'secret.txt').encode()!r}, 0)\n" + must("fd")
                           + "\nb = ctypes.create_string_buffer(64)\nlibc.read(fd, b, 64)\nprint(b.value)"),
        "ctypes connect": top(libc + "import socket, struct\ns = socket.socket()\n"  # a sockaddr_in by hand:
                              + f"a = struct.pack('=H', 2) + struct.pack('!H4s8x', {port}, bytes([127, 0, 0, 1]))\n"
                              + must("libc.connect(s.fileno(), a, 16)")),
        "late thread": top("import threading, time\ndef late():\n    time.sleep(5)\n"
                           + f"    open({str(outside / 'late.txt')!r}, 'w').write('late')\n"
                           + "    open('../late-eval-test.txt', 'w').write('late')\n"
                           + "threading.Thread(target=late).start()"),  # non-daemon: holds the program past its limit
        "infinite loop": "    while True:\n        pass\n",
        "sys.exit(0) first": top("import sys\nsys.exit(0)"),
        "os._exit(0) first": top("import os\nos._exit(0)"),
        "kill parent": top("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"),
        "kill group": top("import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)"),
        "fork loop": top("import os\nwhile True:\n    os.fork()"),
        "subprocess": top(f"import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {outside}/sh.txt'])"),
        "ctypes fork": top("import ctypes\nctypes.CDLL(None).fork()"),
        # a child in a session of its own, past the group kill, by the fork_exec that subprocess wraps (no audit
        # event): the harness, its subreaper, must kill it; its command line names the sandbox, for pgrep below
        "new session escape": top("import _posixsubprocess, os, sys\nr, w = os.pipe()\n_posixsubprocess.fork_exec("
                                  "[sys.executable, '-c', 'import time; time.sleep(60)', os.getcwd()], "
                                  "[os.fsencode(sys.executable)], True, (w,), None, None, -1, -1, -1, -1, -1, -1, "
                                  "r, w, True, True, -1, None, None, None, -1, None, False)\nos._exit(0)"),
        "memory bomb": top("x = []\nwhile True:\n    x.append(' ' * 10**8)"),
        "huge output": top("while True:\n    print('x' * 100000)"),
        "write outside": top(f"open({str(outside / 'w.txt')!r}, 'w').write('pwned')"),
        "os.open outside": top(f"import os\nos.open({str(outside / 'o.txt')!r}, os.O_CREAT | os.O_WRONLY)"),
        "relative escape": top("open('../escape-eval-test.txt', 'w').write('pwned')"),
        "remove outside": top(f"import os\nos.remove({str(outside / 'keep.txt')!r})"),
        "parent environ": top("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())"),
    }
    if not hook:
        hostile = {n: c for n, c in hostile.items() if "fork" not in n and n != "subprocess"}
    (outside / "keep.txt").write_text("keep")
    recs = [dict(task_id="HumanEval/0", completion=c, name=n) for n, c in hostile.items()]
    recs.append(dict(task_id="HumanEval/0", completion=top("import os\nprint(dict(os.environ))"), name="env"))
    daemon = top(f"import threading\ndef w():\n    while True:\n        open({str(outside / 'd.txt')!r}, 'w')\n"
                 "threading.Thread(target=w, daemon=True).start()")  # may pass: it dies with the program
    recs.append(dict(task_id="HumanEval/0", completion=daemon, name="daemon thread"))
    sandboxes = tmp_path / "sandboxes"  # each eval-sandbox-* directory goes here: '../escape' would land here too
    sandboxes.mkdir()
    env = dict(os.environ, EVAL_SECRET="s3cr3t-" + "x" * 8, OMP_NUM_THREADS="1", TMPDIR=str(sandboxes))
    t0 = time.time()
    completions = write_jsonl(tmp_path / "h.jsonl", recs)
    harness = ["eval.py"] if hook else ["-c", HOOKLESS]
    p = subprocess.run([sys.executable, *harness, "humaneval", "--completions", completions,
                        "--limit", "1", "--workers", "2", "--timeout", "3", "--memory_mb", "512",
                        "--out", tmp_path / "h.json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.time() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    assert elapsed < 60
    res = json.loads((tmp_path / "h.json").read_text())["results"]
    by_name = {s["name"]: s for s in res["samples"]}
    for name in hostile:
        assert not by_name[name]["passed"], (name, by_name[name])
    assert by_name["env"]["passed"]  # reading its own (minimal) environment is allowed, and harmless:
    assert "s3cr3t" not in (tmp_path / "h.json").read_text() + p.stdout + p.stderr
    time.sleep(2)  # past the late thread's write, had it survived
    assert sorted(x.name for x in outside.iterdir()) == ["keep.txt"]
    assert not (sandboxes / "escape-eval-test.txt").exists() and not list(sandboxes.iterdir())  # all removed too
    assert "timed out" in by_name["infinite loop"]["status"] and "timed out" in by_name["late thread"]["status"]
    assert "PermissionError" in by_name["kill parent"]["output"]
    for name in ("read outside", "list outside", "tcp connect", "pidfd signal"):
        assert "PermissionError" in by_name[name]["output"], (name, by_name[name])
    with pytest.raises(BlockingIOError):
        listener.accept()  # no connection ever reached the listener
    with pytest.raises(BlockingIOError):
        udp.recv(16)  # nor any datagram
    with pytest.raises(BlockingIOError):
        unix.accept()  # nor the unix socket
    listener.close(), udp.close(), unix.close()
    survivors = subprocess.run(["pgrep", "-f", f"{sandboxes}/eval-sandbox-"], capture_output=True, text=True)
    assert not survivors.stdout.split()
