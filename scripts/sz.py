"""Print code lines per module (blank lines, comments and docstrings excluded) with per-package totals."""

import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compiler", "tilefarm", "server", "migrations", "bench", "tests")
LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
          tokenize.ENDMARKER}  # fmt: skip


def code_lines(source: str) -> tuple[int, int]:
    """(code lines, tokens) of a Python source; a statement that is only a string literal counts as a docstring."""
    lines: set[int] = set()
    tokens = 0
    statement: list[tokenize.TokenInfo] = []  # the significant tokens of the logical line being read

    def flush():
        nonlocal tokens
        # a bare string statement is a docstring (or a comment written as one): it documents, it does not run
        if statement and not all(t.type == tokenize.STRING for t in statement):
            tokens += len(statement)
            for t in statement:
                lines.update(range(t.start[0], t.end[0] + 1))
        statement.clear()

    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NEWLINE or tok.type == tokenize.ENDMARKER:
            flush()
        elif tok.type not in LAYOUT:
            statement.append(tok)
    return len(lines), tokens


def main() -> int:
    grand = 0
    for pkg in PACKAGES:
        files = sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []
        rows = []
        for f in files:
            n, toks = code_lines(f.read_text())
            rows.append((n, toks, f.relative_to(ROOT).as_posix()))
        rows.sort(key=lambda r: (-r[0], r[2]))
        total = sum(r[0] for r in rows)
        grand += total
        print(f"{pkg + '/':<40} {total:>6} lines  ({len(rows)} files)")
        for n, toks, name in rows:
            print(f"  {name:<38} {n:>6}  {toks / max(n, 1):5.1f} tok/line")
    print(f"{'total':<40} {grand:>6} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
