"""Just enough of a Dockerfile reader for the packaging tests: stages, their
instructions, and the requirements each stage's `pip install` commands name."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, USER, ...
    arguments: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.arguments for i in self.instructions if i.keyword == keyword]

    def pip_installs(self) -> list[PipInstall]:
        """Every `pip install` in the stage's RUN instructions, in order."""
        installs: list[PipInstall] = []
        for run in self.all("RUN"):
            for command in re.split(r"&&|;", run):
                words = shlex.split(command)
                if words[:2] != ["pip", "install"]:
                    continue
                installs.append(PipInstall.parse(words[2:]))
        return installs

    @property
    def user(self) -> str | None:
        users = self.all("USER")
        return users[-1] if users else None


@dataclass(frozen=True)
class PipInstall:
    requirements: tuple[str, ...]
    requirement_files: tuple[str, ...]
    no_deps: bool
    local: bool  # installs the project itself (`.`)
    require_hashes: bool = False
    build_isolation: bool = True

    @staticmethod
    def parse(words: list[str]) -> PipInstall:
        requirements: list[str] = []
        files: list[str] = []
        local = no_deps = require_hashes = False
        build_isolation = True
        words = list(words)
        while words:
            word = words.pop(0)
            if word in ("-r", "--requirement"):
                files.append(words.pop(0))
            elif word == "--no-deps":
                no_deps = True
            elif word == "--require-hashes":
                require_hashes = True
            elif word == "--no-build-isolation":
                build_isolation = False
            elif word.startswith("-"):
                raise ValueError(f"pip option not understood by this reader: {word}")
            elif word == ".":
                local = True
            else:
                requirements.append(word)
        return PipInstall(tuple(requirements), tuple(files), no_deps, local, require_hashes, build_isolation)


def read_stages(path: Path) -> list[Stage]:
    """The stages of a Dockerfile; line continuations joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    arguments_before_from: dict[str, str] = {}  # global ARGs: what FROM ${NAME} means by default
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            name, _, default = arguments.strip().partition("=")
            arguments_before_from[name] = default
        elif keyword == "FROM":
            parts = re.sub(r"\$\{(\w+)\}", lambda m: arguments_before_from[m.group(1)], arguments).split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, arguments.strip()))
    return stages
