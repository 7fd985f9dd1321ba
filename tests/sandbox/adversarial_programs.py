"""Hostile programs for the sandbox and the verdict each must get.

Placeholders filled in by the test: {PORT} (a TCP server the test runs on the host's loopback),
{CANARY} (a host file with secret content), {SECRET} is never given to programs (it is in the host
environment). Programs that probe a defence print "blocked" when it held; the test checks that word.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hostile:
    name: str
    language: str
    source: str
    verdicts: tuple[str, ...]  # acceptable verdicts (one, except where two are equally correct)
    time_s: float = 0.5
    memory_mb: int = 128
    stdout_has: str = ""  # must appear in stdout
    fn_name: str | None = None  # function-call mode (judge with one test expecting 5)
    tags: tuple[str, ...] = field(default=())


PROBE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def probe(ret):
    print("blocked" if ret == -1 else "ALLOWED", ctypes.get_errno())
"""

PROGRAMS: list[Hostile] = [
    # ------------------------------------------------------------------ python: resources
    Hostile("py_infinite_loop", "python", "while True:\n    pass", ("TLE",)),
    Hostile("py_fork_bomb", "python", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
            "        pass", ("TLE",)),
    Hostile("py_memory_bomb", "python", "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", ("MLE",)),
    Hostile("py_output_flood", "python", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", ("OLE",)),
    Hostile("py_stderr_flood", "python", "import sys\nwhile True:\n    sys.stderr.write('e' * 65536)", ("OLE",)),
    Hostile("py_invalid_utf8", "python", "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 4)", ("OK",)),
    Hostile("py_stack_overflow", "python", "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1) + 1\n"
            "f(0)", ("RE", "MLE")),
    Hostile("py_file_size_bomb", "python", "with open('big', 'wb') as f:\n    while True:\n        f.write(b'0' * (1 << 20))",
            ("RE", "OLE")),
    Hostile("py_sleep_forever", "python", "import time\ntime.sleep(10**6)", ("TLE",)),
    Hostile("py_ignore_sigterm", "python", "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass", ("TLE",)),
    Hostile("py_thread_bomb", "python", "import threading, time\nwhile True:\n    try:\n"
            "        threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n"
            "    except RuntimeError:\n        pass", ("TLE", "MLE")),
    # ^ contained either way: the thread cap (RuntimeError, caught: the loop runs into the time limit) or, where the
    # address-space cap comes first (rootless mode: RLIMIT_AS, while RLIMIT_NPROC counts the user's tasks at the
    # run's start), a MemoryError that ends the program (MLE); both seen in rootless CI runs
    # ------------------------------------------------------------------ python: filesystem and secrets
    Hostile("py_write_etc", "python", "open('/etc/credo_pwned', 'w').write('x')", ("RE",)),
    Hostile("py_write_usr", "python", "open('/usr/bin/credo_pwned', 'w').write('x')", ("RE",)),
    Hostile("py_write_root_dir", "python", "open('/credo_pwned', 'w').write('x')", ("RE",)),
    Hostile("py_overwrite_canary", "python", "open('{CANARY}', 'w').write('pwned')", ("RE",)),
    Hostile("py_read_canary", "python", "try:\n    print(open('{CANARY}').read())\nexcept OSError:\n    print('blocked')",
            ("OK",), stdout_has="blocked"),
    Hostile("py_read_root_and_shadow", "python", "for p in ('/root/.bashrc', '/etc/shadow', '/home'):\n    try:\n"
            "        print(open(p).read()[:50])\n    except OSError:\n        print('blocked')", ("OK",),
            stdout_has="blocked"),
    Hostile("py_environment", "python", "import os\nprint(dict(os.environ))\nprint(open('/proc/1/environ').read())",
            ("OK", "RE")),
    Hostile("py_proc_snoop", "python", "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "print(len(pids))\nfor p in pids:\n    try:\n        print(open(f'/proc/{p}/cmdline').read())\n"
            "    except OSError:\n        pass", ("OK",)),
    Hostile("py_many_files", "python", "import os\nfor i in range(200000):\n    open(f'/tmp/f{i}', 'w').close()",
            ("OK", "RE", "TLE", "MLE")),
    Hostile("py_setuid_root", "python", "import os\ntry:\n    os.setuid(0)\n    print('ALLOWED')\nexcept OSError:\n"
            "    print('blocked')", ("OK",), stdout_has="blocked"),
    # ------------------------------------------------------------------ python: network
    Hostile("py_connect_loopback", "python", "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {PORT}), 1)\n"
            "    print('connected')\nexcept OSError:\n    print('blocked')", ("OK",), stdout_has="blocked"),
    Hostile("py_connect_internet", "python", "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), 1)\n"
            "    print('connected')\nexcept OSError:\n    print('blocked')", ("OK",), stdout_has="blocked"),
    Hostile("py_udp_socket", "python", "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            ".sendto(b'x', ('127.0.0.1', {PORT}))\n    print('sent')\nexcept OSError:\n    print('blocked')", ("OK",),
            stdout_has="blocked"),
    Hostile("py_netlink", "python", "import socket\ntry:\n    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n"
            "    print('ALLOWED')\nexcept OSError:\n    print('blocked')", ("OK",), stdout_has="blocked"),
    # ------------------------------------------------------------------ python: escapes and raw syscalls
    Hostile("py_daemon_double_fork", "python", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
            "    if os.fork() == 0:\n        time.sleep(100)\n    os._exit(0)\nprint('parent done')", ("OK",)),
    Hostile("py_kill_everything", "python", "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('still here')",
            ("OK", "RE")),
    Hostile("py_ptrace", "python", PROBE + "probe(libc.ptrace(0, 0, 0, 0))", ("OK",), stdout_has="blocked"),
    Hostile("py_unshare_userns", "python", PROBE + "probe(libc.unshare(0x10000000 | 0x40000000))", ("OK",),
            stdout_has="blocked"),
    Hostile("py_mount_tmpfs", "python", PROBE + "probe(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))", ("OK",),
            stdout_has="blocked"),
    Hostile("py_raw_bpf", "python", PROBE + "probe(libc.syscall(321, 0, 0, 0))", ("OK",), stdout_has="blocked"),
    Hostile("py_raw_io_uring", "python", PROBE + "probe(libc.syscall(425, 8, 0))", ("OK",), stdout_has="blocked"),
    Hostile("py_raw_keyctl", "python", PROBE + "probe(libc.syscall(250, 0, 0, 0, 0, 0))", ("OK",),
            stdout_has="blocked"),
    Hostile("py_clock_settime", "python", PROBE + "probe(libc.syscall(227, 0, 0))", ("OK",), stdout_has="blocked"),
    # ------------------------------------------------------------------ python: harness tampering (fn mode)
    Hostile("py_harness_exit_early", "python", "import os\ndef add(a, b):\n    os._exit(0)", ("WA",), fn_name="add"),
    Hostile("py_harness_fake_sentinel", "python",
            "def add(a, b):\n    print('\\n@@credo-00000000000000000000000000000000@@5')\n    return 0", ("WA",),
            fn_name="add"),
    Hostile("py_harness_monkeypatch", "python", "import json, sys, builtins, io\njson.dumps = lambda *a, **k: '5'\n"
            "sys.stdout = io.StringIO()\nbuiltins.print = lambda *a, **k: None\ndef add(a, b):\n    return 0",
            ("WA",), fn_name="add"),
    Hostile("py_harness_steal_stdin", "python", "import sys\nsys.stdin.read()\ndef add(a, b):\n    return a + b",
            ("WA", "RE"), fn_name="add"),
    # ------------------------------------------------------------------ C / C++
    Hostile("c_fork_bomb", "c", "#include <unistd.h>\nint main(){for(;;)fork();}", ("TLE",)),
    Hostile("c_thread_bomb", "c", "#include <pthread.h>\n#include <unistd.h>\nvoid*f(void*a){for(;;)sleep(1);return 0;}\n"
            "int main(){pthread_t t;for(;;)pthread_create(&t,0,f,0);}", ("TLE",)),
    Hostile("c_null_deref", "c", "int main(){volatile int*p=0;return *p;}", ("RE",)),
    Hostile("c_stack_overflow", "c", "int f(volatile int n){volatile char buf[4096];buf[0]=n;return f(n+1)+buf[0];}\n"
            "int main(){return f(0);}", ("RE",)),
    Hostile("c_sleep_forever", "c", "#include <unistd.h>\nint main(){for(;;)sleep(100);}", ("TLE",)),
    Hostile("c_file_size_bomb", "c", "#include <stdio.h>\nint main(){FILE*f=fopen(\"big\",\"w\");char b[65536]={0};"
            "for(;;)fwrite(b,1,sizeof b,f);}", ("OLE", "RE")),
    Hostile("c_connect_loopback", "c", "#include <stdio.h>\n#include <sys/socket.h>\n#include <netinet/in.h>\n"
            "#include <arpa/inet.h>\nint main(){int s=socket(AF_INET,SOCK_STREAM,0);if(s<0){puts(\"blocked\");return 0;}"
            "struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_port=htons({PORT});"
            "a.sin_addr.s_addr=inet_addr(\"127.0.0.1\");puts(connect(s,(void*)&a,sizeof a)?\"blocked\":\"connected\");}",
            ("OK",), stdout_has="blocked"),
    Hostile("c_ptrace", "c", "#include <stdio.h>\n#include <sys/ptrace.h>\nint main(){puts(ptrace(PTRACE_TRACEME,0,0,0)"
            "==-1?\"blocked\":\"ALLOWED\");}", ("OK",), stdout_has="blocked"),
    Hostile("c_compile_bomb_urandom", "c", "#include \"/dev/urandom\"\nint main(){}", ("CE",)),
    Hostile("cpp_template_bomb", "cpp", "template<int N> struct F { enum { v = F<N-1>::v + F<N-2>::v }; };\n"
            "template<> struct F<0> { enum { v = 0 }; };\ntemplate<> struct F<1> { enum { v = 1 }; };\n"
            "int main(){ return F<100000>::v; }", ("CE",)),
    # ------------------------------------------------------------------ JavaScript
    Hostile("js_infinite_loop", "javascript", "while (true) {}", ("TLE",)),
    Hostile("js_memory_bomb", "javascript", "const a = []; while (true) a.push(Buffer.alloc(16 << 20, 1));", ("MLE",),
            memory_mb=192),
    Hostile("js_child_process_secret", "javascript", "const cp = require('child_process');\n"
            "try { console.log(cp.execSync('cat {CANARY}').toString()); } catch (e) { console.log('blocked'); }",
            ("OK",), stdout_has="blocked"),
    Hostile("js_net_connect", "javascript", "require('net').connect({PORT}, '127.0.0.1')"
            ".on('connect', () => console.log('connected')).on('error', () => console.log('blocked'));",
            ("OK",), stdout_has="blocked"),
    # ------------------------------------------------------------------ bash
    # contained by the pids limit: bash gives up forking and may even exit 0; the host checks verify containment
    Hostile("bash_fork_bomb", "bash", ":(){ :|:& };:\nwait", ("TLE", "RE", "OK")),
    Hostile("bash_dev_tcp", "bash", "if exec 3<>/dev/tcp/127.0.0.1/{PORT}; then echo connected; else echo blocked; fi",
            ("OK",), stdout_has="blocked"),
    Hostile("bash_background_daemons", "bash", "(sleep 100 &)\nnohup sleep 100 >/dev/null 2>&1 &\nsetsid sleep 100 &\n"
            "echo started", ("OK",)),
    Hostile("bash_read_canary", "bash", "cat {CANARY} 2>/dev/null || echo blocked", ("OK",), stdout_has="blocked"),
    # ------------------------------------------------------------------ Java
    Hostile("java_infinite_loop", "java", "public class Main{public static void main(String[] a){for(;;){}}}", ("TLE",),
            time_s=2.0, memory_mb=256),
    Hostile("java_memory_bomb", "java", "import java.util.*;public class Main{public static void main(String[] a){"
            "List<byte[]> l=new ArrayList<>();for(;;)l.add(new byte[1<<24]);}}", ("MLE",), time_s=3.0, memory_mb=256),
]
