"""execd's Metric routes: one sample of the sandbox's CPU and memory from /proc."""

from __future__ import annotations

import os
import time
from typing import Any

from ..http.exchange import Exchange, now_ms


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as proc_stat:
        values = [int(v) for v in proc_stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values), idle


def metrics() -> dict[str, Any]:
    """One `/metrics` sample from /proc (CPU over 50 ms, not execd's 1 s)."""
    cpu_count = os.cpu_count() or 1
    try:
        total0, idle0 = _cpu_times()
        time.sleep(0.05)
        total1, idle1 = _cpu_times()
        busy = 100.0 * (1 - (idle1 - idle0) / max(1, total1 - total0))
        with open("/proc/meminfo") as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in meminfo}
        total_kib = fields["MemTotal"]
        used_kib = total_kib - fields.get("MemAvailable", fields.get("MemFree", 0))
    except (OSError, ValueError, KeyError, IndexError):
        busy = min(100.0, 100.0 * os.getloadavg()[0] / cpu_count)
        total_kib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 1024
        used_kib = 0
    return {
        "cpu_count": cpu_count,
        "cpu_used_pct": round(busy, 2),
        "mem_total_mib": round(total_kib / 1024, 2),
        "mem_used_mib": round(used_kib / 1024, 2),
        "timestamp": now_ms(),
    }


def get_metrics(ex: Exchange) -> None:
    """GET /metrics."""
    ex.send_json(200, metrics())
