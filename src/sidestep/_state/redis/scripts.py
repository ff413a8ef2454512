"""The Lua script behind `RedisStore`: every store operation as one atomic step on the server.

It is `circuit` and `MemoryStore` transcribed, so that processes sharing a
Redis see exactly what threads sharing a `MemoryStore` see. One script holds
every operation (``ARGV[1]`` names it), so one SHA is loaded once per server.
It is sent as one text, written in parts: its head here (the call's
arguments, the clocks, the names of keys), then `script_storage`,
`script_circuit` and `script_operations`.

Keys, all under the prefix ``P``, and those of one origin under its base
``P:{<origin hash>}`` (``B``), whose hash tag puts them in one Redis
Cluster slot; each call names the origin's base as its one key, which routes
it there (hashes only: no model, path or credential is part of a key's name):

- ``B:s:<scope_id>`` — one unhealthy scope: a hash of the `Circuit` fields, its
  probe leases and its `ScopeKey` parts (origin, kind, credential
  fingerprint, model) for snapshots;
- ``B:o`` — a sorted set of the origin's scopes, scored by when each
  expires: while it counts none, admission needs no key at all;
- ``B:q`` — the origin's sequence (generations, and the order of its news);
- ``B:f`` — the step of the sequence at which one of the origin's scopes was
  last forgotten (the staleness rule of healthy tickets);
- ``B:d:<token>`` — an admission given up (its reply was lost), for as long
  as its lease: if it reaches the server after the ``drop`` that gave it up,
  it changes nothing;
- ``P:i`` — on one Redis only (the ``index`` argument): every scope as
  ``<origin hash>:<scope_id>``, scored by expiry, for the store-wide cap and
  one-call views. Redis Cluster has no key that every call touches: the cap
  is per origin and the views go origin by origin (``oh`` given).
- ``P:u`` (one Redis; on Redis Cluster ``B:u``, the origin's) — the scopes of
  unrouted traffic alone, as in ``P:i`` (``B:o``): those no routed request
  recorded a result on. Making room forgets them first, and only a route's new
  scope forgets one that is not among them. A scope written before this set
  was kept is not in it: it is spared as a route's.

Each time an origin gains a scope or loses one, the script publishes
``<origin hash> <1 if it has any left, else 0> <step of its sequence>`` on
the channel ``P:m``: every process's mirror (`mirror`) follows it. On
Redis Cluster a publish reaches every node. ``ZRANGE … BYSCORE`` needs Redis
6.2 or later.

Two clocks: windows follow ``now`` — the server's ``TIME`` in seconds, or the
caller's clock when the private test hook asks for it — and times go back
relative to it, for the caller to put on its own clock (a snapshot sends its
instants with the server's ``now``: `Calls.shift` keeps one offset for them). Expiry, leases and
the sequence follow the server's real clock in milliseconds, so keys expire
as Redis sees time pass. Every step of the sequence is at least the
server's time in milliseconds times 1000, so it never goes back, and a
generation is never reused, even after its key expired; sequences of
different origins compare by that clock.
"""

from __future__ import annotations

from .script_circuit import CIRCUIT
from .script_operations import OPERATIONS
from .script_storage import STORAGE

__all__ = ["SCRIPT"]

# What every run starts with: the call's arguments, the clocks, the names of keys.
_HEAD = r"""
local pos = 0
local function arg() pos = pos + 1; return ARGV[pos] end

local op, P = arg(), arg()
local caller_now, caller_clock = tonumber(arg()), arg() == '1'
local TTL, MAX = tonumber(arg()), tonumber(arg())
-- The store-wide index (one Redis): the cap counts every scope, and the
-- operators' views read it in one call. Without it (Redis Cluster) each
-- origin is capped on its own and those views go origin by origin.
local IDX = nil
if arg() == '1' then IDX = P .. ':i' end
local time = redis.call('TIME')
local real = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
if caller_clock then now = caller_now end

local INF = math.huge
-- Every key of one origin starts with its base, whose hash tag puts them in one slot
-- (`Calls.anchor` names the same base, for Redis Cluster to route the call).
local function base(oh) return P .. ':{' .. oh .. '}' end
local function skey(oh, sid) return base(oh) .. ':s:' .. sid end
local function okey(oh) return base(oh) .. ':o' end
local function fkey(oh) return base(oh) .. ':f' end
local function qkey(oh) return base(oh) .. ':q' end
local function dkey(oh, token) return base(oh) .. ':d:' .. token end
-- The store-wide index names a scope with its origin: '<origin hash>:<scope id>'.
local function member(oh, sid) return oh .. ':' .. sid end
local function split(m) return string.sub(m, 1, 16), string.sub(m, 18) end
-- Numbers always cross into Redis as text written here: its own conversion
-- would round large integers.
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
"""

# The script as sent: its parts end to end, each beginning with a line break.
SCRIPT = _HEAD + STORAGE + CIRCUIT + OPERATIONS
