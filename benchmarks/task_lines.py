"""Lines of the task file's code: `skygreen/task/` in this tree beside the nine modules that
read the task file before it was declared once (at 3051ad0, the package root's `spec`,
`spec_model`, `spec_fields`, `spec_gpus`, `spec_memory`, `fields`, `task_yaml`, `task_checks`
and `settings`; a module the commit lacks is left out: `--against ac82724`, when the change was
asked for, counts the eight it had).

    .venv/bin/python benchmarks/task_lines.py [--against 3051ad0]

Two counts per module: every line (`wc -l`), and code lines, the lines that hold a token of
code (a docstring, a comment or a blank line is not code; a string inside an expression, such
as a field's meaning, is). Each side also says how many keys its task file has (the rows of its
reference table), since lines per key is the fair measure between trees with different keys.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE_MODULES = ("spec", "spec_model", "spec_fields", "spec_gpus", "spec_memory", "fields", "task_yaml",
                  "task_checks", "settings")  # fmt: skip
_LAYOUT = (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE, tokenize.NL)


def code_lines(source: str) -> int:
    """The lines that hold a token of code: not a docstring (a string that is a statement of its
    own), a comment or a blank line."""
    lines: set[int] = set()
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        starts_statement = previous in _LAYOUT
        if token.type != tokenize.COMMENT:
            previous = token.type
        if token.type in (*_LAYOUT, tokenize.COMMENT, tokenize.ENDMARKER):
            continue
        if token.type == tokenize.STRING and starts_statement:
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def counts(sources: dict[str, str]) -> list[tuple[str, int, int]]:
    """(name, all lines, code lines) of each module, largest first."""
    rows = [(name, len(text.splitlines()), code_lines(text)) for name, text in sources.items()]
    return sorted(rows, key=lambda row: -row[1])


def at_commit(commit: str) -> dict[str, str]:
    """The text at `commit` of those of the nine modules it has."""
    show = ["git", "-C", str(REPO), "show"]
    listed = subprocess.check_output(["git", "-C", str(REPO), "ls-tree", "--name-only", commit, "skygreen/"], text=True)
    present = set(listed.split())
    return {
        name: subprocess.check_output([*show, f"{commit}:skygreen/{name}.py"], text=True)
        for name in BEFORE_MODULES
        if f"skygreen/{name}.py" in present
    }


def keys_at_commit(sources: dict[str, str]) -> int:
    """The keys of the reference table then: `spec_fields`' `TaskField(path=...)` rows."""
    return len(re.findall(r"TaskField\(\s*path=", sources["spec_fields"]))


def keys_in_this_tree() -> int:
    from skygreen.task.reference import TASK_FIELDS

    return len(TASK_FIELDS)


def in_this_tree() -> dict[str, str]:
    return {path.stem: path.read_text(encoding="utf-8") for path in sorted((REPO / "skygreen" / "task").glob("*.py"))}


def report(title: str, rows: list[tuple[str, int, int]]) -> tuple[int, int]:
    print(f"{title}\n  {'module':<14}{'lines':>7}{'code':>7}")
    for name, lines, code in rows:
        print(f"  {name:<14}{lines:>7,}{code:>7,}")
    total = (sum(row[1] for row in rows), sum(row[2] for row in rows))
    print(f"  {'total':<14}{total[0]:>7,}{total[1]:>7,}\n")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="3051ad0", help="the commit whose nine task-file modules to count")
    args = parser.parse_args()
    sources = at_commit(args.against)
    before = report(f"before ({args.against}, {len(sources)} modules)", counts(sources))
    now = report("this tree (skygreen/task/)", counts(in_this_tree()))
    print(f"lines: {now[0]:,} vs {before[0]:,} ({now[0] / before[0]:.3f}x); "
          f"code lines: {now[1]:,} vs {before[1]:,} ({now[1] / before[1]:.3f}x)")  # fmt: skip
    keys = (keys_in_this_tree(), keys_at_commit(sources))
    print(f"keys: {keys[0]} vs {keys[1]}; lines per key: {now[0] / keys[0]:.1f} vs {before[0] / keys[1]:.1f}; "
          f"code lines per key: {now[1] / keys[0]:.1f} vs {before[1] / keys[1]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
