"""The Redis side of RedisStore's shared pool: its keys and one Lua script per change.

Each script runs atomically in Redis (no other command runs between its steps), which is what
makes a take, a commit or a lease check safe across processes and hosts. Every script gets
the pool's keys in ``KEY_NAMES`` order (named by ``PREAMBLE``) and reads Redis's own clock
(``now``, in seconds), so the hosts' clocks need not agree. What the keys hold is in
``_pool_redis``'s docstring; the arguments of each script are in the comment above it, and
its answer is read with :func:`text` and :func:`number`.
"""

from __future__ import annotations

from typing import Any

KEY_NAMES = (
    "options",
    "idle",
    "lent",
    "owners",
    "creating",
    "leader",
    "epoch",
    "members",
    "closed",
    "id",
)
PREAMBLE = """
local options, idle, lent, owners, creating, leader, epoch, members, closed, pool_id =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function is_leader(owner, ep)
  return redis.call('GET', leader) == owner and redis.call('GET', epoch) == ep
end
"""

SCRIPTS = {
    # ARGV: fingerprint, id. The first process sets the pool's options, the others must match;
    # and its id, kept for good (an id a process holds restores it after Redis lost it).
    # {'ok' or 'closed' or the options, the id}.
    "options": """
if redis.call('EXISTS', closed) == 1 then return {'closed', ''} end
redis.call('SET', pool_id, ARGV[2], 'NX')
local current = redis.call('GET', options)
if not current then redis.call('SET', options, ARGV[1]); current = ARGV[1] end
if current == ARGV[1] then current = 'ok' end
return {current, redis.call('GET', pool_id)}
""",
    # ARGV: owner, lease, max_size, token, reservation. An idle one, or leave to create one.
    "take": """
if redis.call('EXISTS', closed) == 1 then return {'closed'} end
local got = redis.call('ZPOPMAX', idle)
if #got > 0 then
  redis.call('ZADD', lent, now + tonumber(ARGV[2]), got[1])
  redis.call('HSET', owners, got[1], ARGV[1])
  return {'lent', got[1], got[2], tostring(now)}
end
redis.call('ZREMRANGEBYSCORE', creating, '-inf', now)
if redis.call('ZCARD', lent) + redis.call('ZCARD', creating) < tonumber(ARGV[3]) then
  redis.call('ZADD', creating, now + tonumber(ARGV[5]), ARGV[4])
  return {'create'}
end
return {'wait'}
""",
    # ARGV: owner, epoch, size, max_size, token, reservation, the leader's refills running.
    "reserve": """
if redis.call('EXISTS', closed) == 1 or not is_leader(ARGV[1], ARGV[2]) then return 0 end
redis.call('ZREMRANGEBYSCORE', creating, '-inf', now)
local n = redis.call('ZCARD', idle)
local alive = n + redis.call('ZCARD', lent) + redis.call('ZCARD', creating)
if n + tonumber(ARGV[7]) >= tonumber(ARGV[3]) or alive >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', creating, now + tonumber(ARGV[6]), ARGV[5])
return 1
""",
    # ARGV: token, id, 'lent' or 'idle', owner, lease, lifetime ('' none), epoch ('' none).
    "commit": """
redis.call('ZREM', creating, ARGV[1])
if ARGV[3] == 'lent' then
  redis.call('ZADD', lent, now + tonumber(ARGV[5]), ARGV[2])
  redis.call('HSET', owners, ARGV[2], ARGV[4])
  return 'lent'
end
if redis.call('EXISTS', closed) == 1 then return 'closed' end
if ARGV[7] ~= '' and not is_leader(ARGV[4], ARGV[7]) then return 'fenced' end
local expires = 'inf'
if ARGV[6] ~= '' then expires = now + tonumber(ARGV[6]) end
redis.call('ZADD', idle, expires, ARGV[2])
return 'idle'
""",
    # ARGV: token. A create that failed gives its reservation back.
    "unreserve": "redis.call('ZREM', creating, ARGV[1]); return 1",
    # ARGV: id, 'idle' or 'drop', seconds left ('' none). A lent sandbox comes back.
    "give_back": """
redis.call('ZREM', lent, ARGV[1])
redis.call('HDEL', owners, ARGV[1])
if ARGV[2] == 'idle' and redis.call('EXISTS', closed) == 0 then
  local expires = 'inf'
  if ARGV[3] ~= '' then expires = now + tonumber(ARGV[3]) end
  redis.call('ZADD', idle, expires, ARGV[1])
  return 'idle'
end
return 'dropped'
""",
    # ARGV: owner, lease, n, n ids, tokens... Heartbeat, borrow leases (registered again if
    # lost) and the reservations of this process's creates still running.
    "renew": """
local lease = tonumber(ARGV[2])
redis.call('ZADD', members, now + lease, ARGV[1])
for i = 4, 3 + tonumber(ARGV[3]) do
  redis.call('ZADD', lent, now + lease, ARGV[i])
  redis.call('HSET', owners, ARGV[i], ARGV[1])
end
for i = 4 + tonumber(ARGV[3]), #ARGV do redis.call('ZADD', creating, 'XX', now + lease, ARGV[i]) end
return 1
""",
    # ARGV: owner, lease in ms. The epoch if this owner leads (now or from now on), else ''.
    "lead": """
if redis.call('EXISTS', closed) == 1 then return 'closed' end
local current = redis.call('GET', leader)
if current == ARGV[1] then
  redis.call('PEXPIRE', leader, ARGV[2])
  return redis.call('GET', epoch) or ''
end
if current then return '' end
redis.call('SET', leader, ARGV[1], 'PX', ARGV[2])
return tostring(redis.call('INCR', epoch))
""",
    # ARGV: owner, epoch. The leader takes the sandboxes whose borrow lease ran out.
    "expired": """
if not is_leader(ARGV[1], ARGV[2]) then return {} end
local ids = redis.call('ZRANGEBYSCORE', lent, '-inf', now)
for _, id in ipairs(ids) do redis.call('ZREM', lent, id); redis.call('HDEL', owners, id) end
redis.call('ZREMRANGEBYSCORE', creating, '-inf', now)
redis.call('ZREMRANGEBYSCORE', members, '-inf', now)
return ids
""",
    # The idle sandboxes and Redis's time: {now, id, expiry, id, expiry...}.
    "idle": """
local out = {tostring(now)}
for _, v in ipairs(redis.call('ZRANGE', idle, 0, -1, 'WITHSCORES')) do table.insert(out, v) end
return out
""",
    # ARGV: id, seconds left. An idle sandbox was renewed (if still idle).
    "renewed": "return redis.call('ZADD', idle, 'XX', now + tonumber(ARGV[2]), ARGV[1])",
    # ARGV: id. An idle sandbox leaves the pool: 1 if it was still idle.
    "drop_idle": "return redis.call('ZREM', idle, ARGV[1])",
    # Every id Redis knows: idle and lent.
    "known": """
local ids = redis.call('ZRANGE', idle, 0, -1)
for _, id in ipairs(redis.call('ZRANGE', lent, 0, -1)) do table.insert(ids, id) end
return ids
""",
    # ARGV: ids... Sandboxes the server no longer has.
    "forget": """
for i = 1, #ARGV do
  redis.call('ZREM', idle, ARGV[i]); redis.call('ZREM', lent, ARGV[i])
  redis.call('HDEL', owners, ARGV[i])
end
return 1
""",
    # ARGV: owner. A process leaves; the last one out takes every sandbox left, to delete:
    # {'last', ids...}, else {'stay'}.
    "leave": """
redis.call('ZREM', members, ARGV[1])
if redis.call('GET', leader) == ARGV[1] then redis.call('DEL', leader) end
redis.call('ZREMRANGEBYSCORE', members, '-inf', now)
if redis.call('ZCARD', members) > 0 then return {'stay'} end
local ids = {'last'}
for _, id in ipairs(redis.call('ZRANGE', idle, 0, -1)) do table.insert(ids, id) end
for _, id in ipairs(redis.call('ZRANGE', lent, 0, -1)) do table.insert(ids, id) end
redis.call('DEL', idle, lent, owners, creating, options)
return ids
""",
    # The owners whose heartbeat runs.
    "members": "return redis.call('ZRANGEBYSCORE', members, now, '+inf')",
    # ARGV: how long (ms) the pool stays closed. Ends the pool everywhere.
    "destroy": """
redis.call('SET', closed, '1', 'PX', ARGV[1])
local ids = redis.call('ZRANGE', idle, 0, -1)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', lent, '-inf', now)) do table.insert(ids, id) end
redis.call('DEL', idle, leader, options, creating)
return ids
""",
}


def text(value: Any) -> Any:
    """A script's answer with bytes decoded (a caller's client may not decode)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [text(item) for item in value]
    return value


def number(value: str) -> float:
    """A score as Redis writes it (``inf`` included)."""
    return float(value)
