"""How large the serving core is: lines in edged/serve/ and edged/daemon/ at one or more commits.

    python bench/lines.py [REV ...]   (default: HEAD)

Two counts per commit: every line (what `wc -l` says), and code lines alone: not blank, not a
comment, not a docstring. The second is the one a change of comments cannot move.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("edged/serve", "edged/daemon")
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(source: str) -> int:
    """Lines holding a token that is neither a comment nor part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def count(rev: str) -> tuple[int, int]:
    """(every line, code lines) of the Python files under FOLDERS at `rev`."""
    listing = ["git", "ls-tree", "-r", "--name-only", rev, "--", *FOLDERS]
    listed = subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    total = code = 0
    for path in (name for name in listed if name.endswith(".py")):
        source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True)
        total += source.stdout.count("\n")
        code += code_lines(source.stdout)
    return total, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="*", default=["HEAD"], help="commits to count at (default: HEAD)")
    for rev in parser.parse_args().revs:
        total, code = count(rev)
        print(f"{rev}: {total} lines, {code} of them code (no blank line, comment or docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
