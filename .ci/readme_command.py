"""Print the N-th command of README.md's first ```bash block (CI runs the README's own commands)."""
import sys

path, n = sys.argv[1], int(sys.argv[2])
lines = open(path, encoding="utf-8").read().splitlines()
start = next(i for i, line in enumerate(lines) if line.strip() == "```bash")
cmds = []
for line in lines[start + 1:]:
    if line.strip() == "```":
        break
    code = line.split("  #", 1)[0].strip()
    if code:
        cmds.append(code)
print(cmds[n - 1])
