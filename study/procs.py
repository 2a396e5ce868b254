"""Process-tree helper: end exactly the processes a script or test started (by PID, never by name)."""
from __future__ import annotations

import os


def descendants(pid: int) -> list[int]:
    """PIDs of every process below `pid`, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out
