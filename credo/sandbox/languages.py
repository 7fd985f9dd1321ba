"""Languages the sandbox runs, how to compile and run each, and detection from a response or source text.

A language is available when its toolchain runs inside the sandbox (checked once by
:meth:`Sandbox.languages`); commands use absolute paths of the host's read-only ``/usr``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Language:
    name: str
    source_file: str  # file name the source is written to in the work dir
    run: tuple[str, ...]  # command run per test (in the work dir)
    compile: tuple[str, ...] | None = None  # compile command, None for interpreted languages
    artifacts: tuple[str, ...] = ()  # files the compile step produces (cached by source hash)
    version: tuple[str, ...] = ()  # command that proves the toolchain works
    min_processes: int = 0  # runtimes with many threads (JVM, node) need a higher pids limit
    memory_overhead_mb: int = 0  # runtime overhead added to the user's memory limit
    # rootless mode's RLIMIT_AS = memory limit + overhead + this: address space a runtime reserves without using it
    address_space_mb: int = 1024
    env: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    # stderr patterns that mean the program never got past parsing (reported as CE for interpreted languages)
    syntax_errors: tuple[str, ...] = ()


LANGUAGES: dict[str, Language] = {
    lang.name: lang for lang in (
        Language("python", "main.py", ("/usr/bin/python3", "-I", "-S", "-B", "main.py"),
                 version=("/usr/bin/python3", "--version"), aliases=("py", "python3"),
                 syntax_errors=(r"^(SyntaxError|IndentationError|TabError): ",)),
        Language("c", "main.c", ("./main",), compile=("/usr/bin/gcc", "-O2", "-std=gnu17", "-pipe", "-o", "main",
                                                      "main.c", "-lm"),
                 artifacts=("main",), version=("/usr/bin/gcc", "--version")),
        Language("cpp", "main.cpp", ("./main",), compile=("/usr/bin/g++", "-O2", "-std=gnu++17", "-pipe", "-o",
                                                          "main", "main.cpp"),
                 artifacts=("main",), version=("/usr/bin/g++", "--version"), aliases=("c++", "cc", "cxx")),
        Language("javascript", "main.js", ("/usr/bin/node", "--stack-size=8000", "main.js"),
                 version=("/usr/bin/node", "--version"), min_processes=32, memory_overhead_mb=64, address_space_mb=2048,
                 aliases=("js", "node", "nodejs"), syntax_errors=(r"^SyntaxError: ",)),
        Language("bash", "main.sh", ("/usr/bin/bash", "main.sh"), version=("/usr/bin/bash", "--version"),
                 aliases=("sh", "shell"), syntax_errors=(r"syntax error",)),
        Language("java", "Main.java", ("/usr/bin/java", "-Xss64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                                       "-Xshare:auto", "-cp", ".", "Main"),
                 compile=("/usr/bin/javac", "-J-XX:+UseSerialGC", "-J-Xshare:auto", "-encoding", "UTF-8",
                          "Main.java"),
                 artifacts=("Main.class",), version=("/usr/bin/java", "-version"), min_processes=64,
                 memory_overhead_mb=192, address_space_mb=8192),  # the JVM reserves heap, class space, arenas
        Language("go", "main.go", ("./main",), compile=("/usr/bin/go", "build", "-o", "main", "main.go"),
                 artifacts=("main",), version=("/usr/bin/go", "version"), min_processes=64, address_space_mb=4096,
                 env={"GOCACHE": "/tmp/gocache", "GOPATH": "/tmp/gopath", "GO111MODULE": "off"}),
        Language("rust", "main.rs", ("./main",), compile=("/usr/bin/rustc", "-O", "-o", "main", "main.rs"),
                 artifacts=("main",), version=("/usr/bin/rustc", "--version"), aliases=("rs",)),
    )
}
_ALIASES = {alias: lang.name for lang in LANGUAGES.values() for alias in (lang.name, *lang.aliases)}


def get_language(name: str) -> Language:
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        raise ValueError(f"unknown language {name!r}; known: {', '.join(LANGUAGES)}")
    return LANGUAGES[key]


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9+#_-]*)[^\n]*\n(.*?)```", re.DOTALL)

_HINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("java", (r"\bpublic\s+static\s+void\s+main\s*\(", r"\bclass\s+Main\b", r"System\.out\.print")),
    ("cpp", (r"#include\s*<(iostream|bits/stdc\+\+\.h|vector|string|algorithm|map)>", r"\bstd::", r"\bcout\s*<<",
             r"using\s+namespace\s+std")),
    ("c", (r"#include\s*<(stdio|stdlib|string|math)\.h>", r"\bprintf\s*\(", r"\bscanf\s*\(")),
    ("rust", (r"\bfn\s+main\s*\(\s*\)", r"\blet\s+mut\b", r"println!\(")),
    ("go", (r"^\s*package\s+main\b", r"\bfunc\s+main\s*\(\s*\)", r"\bfmt\.Print")),
    ("javascript", (r"\bconsole\.log\s*\(", r"\brequire\s*\(\s*['\"]", r"\b(const|let)\s+\w+\s*=", r"=>")),
    ("bash", (r"^#!\s*/bin/(ba)?sh", r"^\s*echo\s", r"\$\{?\w+\}?", r"^\s*(fi|done|esac)\s*$")),
    ("python", (r"^\s*def\s+\w+\s*\(", r"^\s*import\s+\w+", r"\bprint\s*\(", r"^\s*from\s+\w+\s+import\b",
                r"input\(\)")),
)


def extract_code(text: str) -> tuple[str, str | None]:
    """(code, fence language tag or None): the first fenced code block if any, else the whole text."""
    match = _FENCE.search(text)
    if match:
        return match.group(2), (match.group(1) or None)
    return text, None


def detect_language(text: str) -> str:
    """Language of a response or source: a fenced block's tag if it names a known language, else the
    language whose characteristic patterns match most lines (MPLSandbox-style rules; ties favour the
    order of ``_HINTS``). Falls back to python."""
    code, tag = extract_code(text)
    if tag and tag.lower() in _ALIASES:
        return _ALIASES[tag.lower()]
    best, best_score = "python", 0
    for name, patterns in _HINTS:
        score = sum(len(re.findall(p, code, flags=re.MULTILINE)) for p in patterns)
        if score > best_score:
            best, best_score = name, score
    return best
