"""A process of a Redis-shared pool, for tests/sockets/test_pool_redis.py and the benchmark.

    python redis_pool_worker.py API_BASE REDIS_URL NAME MODE [options as JSON]

REDIS_URL ``in-process``: a pool of this process only (the benchmark's comparison).

MODE ``borrow``: threads borrow for ``seconds``; prints one JSON line per borrow (id, start,
end, on the host's monotonic clock) and a final ``{"creates": n, "deletes": n}``.
MODE ``hold``: borrows one sandbox, prints its id and the pool's owner id, then sleeps (to be
killed). MODE ``idle``: joins the pool, prints its owner id, then sleeps.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from osb_sync import Client, RedisStore, SandboxPool


def main() -> None:
    api_base, url, name, mode = sys.argv[1:5]
    options: dict[str, Any] = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    client = Client(api_base)
    counts = {"creates": 0, "deletes": 0}
    lock = threading.Lock()
    create, delete = client.create_sandbox, client.delete_quietly

    def counted_create(**kwargs: Any) -> Any:
        with lock:
            counts["creates"] += 1
        return create(**kwargs)

    def counted_delete(sandbox: Any) -> bool:
        with lock:
            counts["deletes"] += 1
        return delete(sandbox)

    client.create_sandbox = counted_create  # type: ignore[method-assign]
    client.delete_quietly = counted_delete  # type: ignore[method-assign]
    store = None if url == "in-process" else RedisStore(url, **options.get("store", {}))
    pool = SandboxPool(client, name=name, store=store, **options.get("pool", {}))
    out = sys.stdout
    if mode == "hold":
        sandbox = pool.acquire(timeout=60)
        print(json.dumps({"id": sandbox.id, "owner": pool._lender._owner}), flush=True)
        time.sleep(600)
    if mode == "idle":
        print(json.dumps({"owner": pool._lender._owner}), flush=True)
        time.sleep(600)
    stop_at = time.monotonic() + options.get("seconds", 10)
    errors: list[str] = []

    def borrow() -> None:
        while time.monotonic() < stop_at:
            try:
                asked = time.monotonic()
                with pool.sandbox(timeout=60) as sb:
                    start = time.monotonic()
                    assert not sb.files.exists("mark"), "a sandbox lent dirty"
                    sb.files.write("mark", "x")
                    end = time.monotonic()
                with lock:
                    out.write(
                        json.dumps({"id": sb.id, "asked": asked, "start": start, "end": end}) + "\n"
                    )
            except Exception as exc:
                errors.append(repr(exc))
                return

    threads = [threading.Thread(target=borrow) for _ in range(options.get("threads", 8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with lock:
        during = dict(counts)
    pool.close()
    print(json.dumps({**during, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
