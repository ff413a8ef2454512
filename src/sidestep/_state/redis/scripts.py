"""The Lua script behind `RedisStore`: every store operation as one atomic step on the server.

It is `_circuit` and `MemoryStore` transcribed, so that processes sharing a
Redis see exactly what threads sharing a `MemoryStore` see. One script holds
every operation (``ARGV[1]`` names it), so one SHA is loaded once per server.

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
the channel ``P:m``: every process's mirror (`_redis_mirror`) follows it. On
Redis Cluster a publish reaches every node. ``ZRANGE … BYSCORE`` needs Redis
6.2 or later.

Two clocks: windows follow ``now`` — the server's ``TIME`` in seconds, or the
caller's clock when the private test hook asks for it — and times go back
relative to it, for the caller to put on its own clock. Expiry, leases and
the sequence follow the server's real clock in milliseconds, so keys expire
as Redis sees time pass. Every step of the sequence is at least the
server's time in milliseconds times 1000, so it never goes back, and a
generation is never reused, even after its key expired; sequences of
different origins compare by that clock.
"""

from __future__ import annotations

__all__ = ["SCRIPT"]

SCRIPT = r"""
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

-- the sequence -------------------------------------------------------------------
-- Each origin has its own, so no key is touched by every call.
local function seq(oh)
  local s = redis.call('GET', qkey(oh))
  if s then return tonumber(s) end
  return real * 1000 - 1
end
local function peek(oh) return math.max(seq(oh) + 1, real * 1000) end
local function bump(oh)
  local s = peek(oh)
  redis.call('SET', qkey(oh), int(s), 'PX', int(TTL))
  return s
end

-- one scope's hash -------------------------------------------------------------------
local function leases(text)
  local out = {}
  for token, until_ms in string.gmatch(text or '', '([^;=]+)=(%d+)') do
    if tonumber(until_ms) > real then out[#out + 1] = {token, until_ms} end
  end
  return out
end
local function buckets(text)
  local out = {}
  for i, s, f in string.gmatch(text or '', '(-?%d+):(%d+):(%d+)') do
    out[#out + 1] = {tonumber(i), tonumber(s), tonumber(f)}
  end
  return out
end
local function join(list, show)
  local parts = {}
  for i, item in ipairs(list) do parts[i] = show(item) end
  return table.concat(parts, ';')
end
local function show_lease(l) return l[1] .. '=' .. l[2] end
local function show_bucket(b) return int(b[1]) .. ':' .. int(b[2]) .. ':' .. int(b[3]) end

local function load(oh, sid)
  local v = redis.call('HMGET', skey(oh, sid), 'st', 'f', 'g', 'b', 'r', 'w', 'rs', 'pl', 'rt')
  if not v[1] then return nil end
  return {st = v[1], f = tonumber(v[2]), g = tonumber(v[3]), b = tonumber(v[4]),
          r = tonumber(v[5]), w = tonumber(v[6]), rs = v[7], pl = leases(v[8]),
          rt = buckets(v[9])}
end
local function save(oh, sid, c)
  redis.call('HSET', skey(oh, sid), 'st', c.st, 'f', int(c.f), 'g', int(c.g), 'b', int(c.b),
             'r', num(c.r), 'w', num(c.w), 'rs', c.rs, 'pl', join(c.pl, show_lease),
             'rt', join(c.rt, show_bucket))
end
local function unlease(oh, sid, pl, token)  -- one lease only: a token names one admission
  for i, l in ipairs(pl) do
    if l[1] == token then
      table.remove(pl, i)
      redis.call('HSET', skey(oh, sid), 'pl', join(pl, show_lease))
      return
    end
  end
end

-- expiry and the indexes -------------------------------------------------------------------
local FLOOR = 0  -- ms a closed or half-open scope lives at least (probe lease, rate window)
local function lifetime(c)
  if c.st == 'open' then
    if c.r == INF then return nil end
    return math.max(0, (c.r - now) * 1000) + TTL
  end
  return math.max(TTL, FLOOR)
end
local function retime(key)  -- a sorted set lives as long as its longest-lived member
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #top == 0 then return end
  if top[2] == 'inf' then redis.call('PERSIST', key) else redis.call('PEXPIREAT', key, top[2]) end
end
-- Unrouted traffic's scopes (see make_room): store-wide beside the index, else the
-- origin's; a member is named as in the index, else as in the origin's set.
local function ukey(oh)
  if IDX then return P .. ':u' end
  return base(oh) .. ':u'
end
local function umember(oh, sid)
  if IDX then return member(oh, sid) end
  return sid
end
-- The sorted sets a scope is in: its origin's, the store-wide index if kept, and
-- unrouted traffic's while it is one of them.
local function sets(oh, sid)
  local out = {{okey(oh), sid}}
  if IDX then out[2] = {IDX, member(oh, sid)} end
  local u, m = ukey(oh), umember(oh, sid)
  if redis.call('ZSCORE', u, m) then out[#out + 1] = {u, m} end
  return out
end
local function place(sid, oh, life)
  local score = '+inf'
  if life then
    redis.call('PEXPIRE', skey(oh, sid), int(math.ceil(life)))
    score = int(real + math.ceil(life))
  else
    redis.call('PERSIST', skey(oh, sid))
  end
  for _, z in ipairs(sets(oh, sid)) do
    redis.call('ZREMRANGEBYSCORE', z[1], '-inf', '(' .. int(real))
    redis.call('ZADD', z[1], score, z[2])
    retime(z[1])
  end
end
local function unhealthy(oh)
  if redis.call('ZCOUNT', okey(oh), int(real), '+inf') > 0 then return 1 end
  return 0
end
-- Every process's mirror learns that an origin's scopes changed: whether it has
-- any left, and a step of the sequence that orders the news.
local function announce(oh)
  redis.call('PUBLISH', P .. ':m', oh .. ' ' .. unhealthy(oh) .. ' ' .. int(bump(oh)))
end
local function forget(sid, oh)
  redis.call('DEL', skey(oh, sid))
  for _, z in ipairs(sets(oh, sid)) do
    redis.call('ZREM', z[1], z[2])
    retime(z[1])
  end
  local s = int(seq(oh))
  redis.call('SET', qkey(oh), s, 'PX', int(TTL))
  redis.call('SET', fkey(oh), s, 'PX', int(TTL))
  announce(oh)
end
-- Past the cap, a scope goes: of the whole store when it keeps the index, else of
-- the origin. The one of unrouted traffic closest to expiring; when none is left, for
-- a route's new scope (ROUTED) only, the route's closest to expiring. Unrouted traffic
-- never makes room with a route's scope: its new scope is not kept then (false). One
-- that was open or half-open is told (DROPPED: its id, key parts, state, reason and
-- failures), for the caller's events.
local DROPPED = {}
local ROUTED = false
local function make_room(oh)
  local z, u = IDX or okey(oh), ukey(oh)  -- their members are named alike
  redis.call('ZREMRANGEBYSCORE', z, '-inf', '(' .. int(real))
  if redis.call('ZCARD', z) < MAX then return true end
  redis.call('ZREMRANGEBYSCORE', u, '-inf', '(' .. int(real))
  while true do
    local victim = redis.call('ZRANGE', u, 0, 0)[1]
    if not victim then
      if not ROUTED then return false end
      victim = redis.call('ZRANGE', z, 0, 0)[1]
    end
    local voh, sid = oh, victim
    if IDX then voh, sid = split(victim) end
    bump(voh)
    if redis.call('EXISTS', skey(voh, sid)) == 1 then
      local v = redis.call('HMGET', skey(voh, sid), 'k', 'o', 'c', 'm', 'st', 'rs', 'f')
      if v[1] and v[5] and v[5] ~= 'closed' then
        DROPPED[#DROPPED + 1] = {sid, v[1], v[2], v[3] or '', v[4] or '', v[5], v[6] or '',
                                 v[7] or '0'}
      end
      forget(sid, voh)
      return true
    end
    -- a member whose scope is gone (forgotten by an earlier script): dropped; on to the
    -- next unless that took it out of the count
    local counted = redis.call('ZREM', z, victim)
    redis.call('ZREM', u, victim)
    if counted == 1 then return true end
  end
end
-- the state machine (_circuit.py) ----------------------------------------------------------
local RATE, KIND, REASON, RETRY_AFTER, SLOW, UNAVAILABLE
local THRESHOLD, COOLDOWN, MAX_COOLDOWN, MULTIPLIER, INITIAL, MAXIMUM

local function fresh()
  return {st = 'closed', f = 0, g = 0, b = 0, r = 0, w = 0, rs = '', pl = {}, rt = {}}
end
local function copy(c, changes)
  local n = {}
  for k, v in pairs(c) do n[k] = v end
  for k, v in pairs(changes) do n[k] = v end
  return n
end
local function healthy(c) return c.st == 'closed' and c.f == 0 and #c.rt == 0 end
local function open(c, reason, window, gen)
  return {st = 'open', f = c.f, g = gen, b = c.b, r = now + window, w = window, rs = reason,
          pl = {}, rt = {}}
end
local function count(rt, failed)
  if not RATE then return {} end
  local index = math.floor(now * RATE.buckets / RATE.window)
  local kept = {}
  for _, b in ipairs(rt) do
    if b[1] > index - RATE.buckets then kept[#kept + 1] = b end
  end
  local last = {index, 0, 0}
  if #kept > 0 and kept[#kept][1] == index then last = table.remove(kept) end
  if failed then
    last = {last[1], last[2], last[3] + 1}
  else
    last = {last[1], last[2] + 1, last[3]}
  end
  kept[#kept + 1] = last
  return kept
end
local function tripped(rt)
  if not RATE then return false end
  local failures, total = 0, 0
  for _, b in ipairs(rt) do
    failures = failures + b[3]
    total = total + b[2] + b[3]
  end
  return total >= RATE.minimum and failures >= RATE.threshold * total
end
local function on_success(c)
  if c.st == 'half_open' then return fresh() end
  if c.st == 'open' then return c end
  local rt = {}
  if #c.rt > 0 then rt = count(c.rt, false) end
  local failed = false
  for _, b in ipairs(rt) do if b[3] > 0 then failed = true end end
  if not failed then rt = {} end
  return copy(c, {f = 0, rt = rt})
end
local function on_failure(c, gen)
  if c.st == 'open' then return c end
  if c.st == 'half_open' then
    local window = COOLDOWN
    if RETRY_AFTER then
      window = math.min(RETRY_AFTER, MAX_COOLDOWN)
    elseif SLOW then
      window = math.min(math.max(c.w, COOLDOWN) * MULTIPLIER, MAX_COOLDOWN)
    end
    return open(c, UNAVAILABLE, window, gen)
  end
  local f = c.f + 1
  local rt = count(c.rt, true)
  if f >= THRESHOLD or tripped(rt) then
    local window = COOLDOWN
    if RETRY_AFTER then window = math.min(RETRY_AFTER, MAX_COOLDOWN) end
    return open(copy(c, {f = f}), UNAVAILABLE, window, gen)
  end
  return copy(c, {f = f, rt = rt})
end
local function on_suspension(c, gen)
  if c.st == 'open' then return c end
  local length
  if RETRY_AFTER then
    length = RETRY_AFTER
    if MAXIMUM then length = math.min(RETRY_AFTER, MAXIMUM) end
  elseif not MAXIMUM then
    length = INF
  elseif c.st == 'half_open' and c.rs == REASON then
    length = math.min(c.w * MULTIPLIER, MAXIMUM)
  else
    length = INITIAL
  end
  return open(c, REASON, length, gen)
end
local function retry_in(c)
  if c.st ~= 'open' then return '0' end
  return num(math.max(0, c.r - now))
end

-- admission ----------------------------------------------------------------------------
if op == 'admit' then
  local oh, probes_max, enforce = arg(), tonumber(arg()), arg() == '1'
  local lease, token, n = tonumber(arg()), arg(), tonumber(arg())
  local sick = unhealthy(oh)
  if n == 0 then
    if sick == 1 then return {1, 0, 1, {}, {}, {}, {}} end
    return {0, seq(oh), 0, {}, {}, {}, {}}
  end
  -- Given up by its sender before it got here (see 'drop'): take nothing.
  if redis.call('EXISTS', dkey(oh, token)) == 1 then return {3, seq(oh), sick, {}, {}, {}, {}} end
  FLOOR = lease
  local sids, cs, refusal = {}, {}, nil
  for i = 1, n do
    sids[i] = arg()
    cs[i] = load(oh, sids[i]) or false
  end
  -- Look first, change later: a refused request must not take probe slots.
  for i = 1, n do
    local c = cs[i]
    if c and c.st == 'open' and now < c.r then
      refusal = {i, c.st, c.rs, num(c.r - now)}
      break
    end
    if c and c.st == 'half_open' and #c.pl >= probes_max then
      refusal = {i, c.st, c.rs, '0'}
      break
    end
  end
  if refusal and enforce then return {3, seq(oh), sick, {}, {}, refusal, {}} end
  local gens, probes, changes = {}, {}, {}
  for i = 1, n do
    local c = cs[i]
    if not c then
      gens[i] = 0
    else
      if not refusal and c.st ~= 'closed' then
        if c.st == 'open' then  -- the window is over: the first probe of a new generation
          c.g = bump(oh)
          c.st = 'half_open'
          changes[#changes + 1] = {i, 'half_open', 'open', c.rs, c.f, '0'}
        end
        c.pl[#c.pl + 1] = {token, int(real + lease)}
        save(oh, sids[i], c)
        place(sids[i], oh, lifetime(c))
        probes[#probes + 1] = i
      end
      gens[i] = c.g
    end
  end
  return {2, seq(oh), sick, gens, probes, refusal or {}, changes}
end

-- verdicts and releases ----------------------------------------------------------------------
local function current(oh, ticket_seq, seen, c)
  if seen ~= 0 then return c ~= nil and c.g == seen end
  -- Admitted while the scope was healthy: current as long as the scope has not
  -- been forgotten since, nor moved past the closed state it was born in.
  local forgot = redis.call('GET', fkey(oh))
  if forgot and tonumber(forgot) > ticket_seq then return false end
  return c == nil or c.g == c.b
end

-- Keep a scope's circuit (forgotten once healthy); false when it is unrouted traffic's
-- new scope and no room is made for it.
local function put(key, oh, before, after)
  if healthy(after) then
    if before then forget(key.sid, oh) end
    return true
  end
  if not before then
    if not make_room(oh) then return false end
    redis.call('HSET', skey(oh, key.sid), 'k', key.kind, 'o', key.origin, 'c', key.credential,
               'm', key.model, 'oh', oh)
    -- unrouted traffic's: scored as it is placed below
    if not ROUTED then redis.call('ZADD', ukey(oh), '+inf', umember(oh, key.sid)) end
  elseif ROUTED then
    redis.call('ZREM', ukey(oh), umember(oh, key.sid))  -- a route's now: spared by the cap
  end
  save(oh, key.sid, after)
  place(key.sid, oh, lifetime(after))
  if not before then announce(oh) end
  return true
end

local function apply(i, key, oh, ticket_seq)
  local before = load(oh, key.sid)
  if not current(oh, ticket_seq, key.seen, before) then return nil end
  local c = before
  if not c then
    if KIND == 'success' then return nil end  -- healthy already
    local g = bump(oh)
    c = copy(fresh(), {g = g, b = g})
  end
  local gen = peek(oh)
  local after
  if KIND == 'success' then after = on_success(c)
  elseif KIND == 'failure' then after = on_failure(c, gen)
  else after = on_suspension(c, gen) end
  if after == before then return nil end
  if after.g == gen or (healthy(after) and c.st ~= 'closed') then bump(oh) end
  if not put(key, oh, before, after) then return nil end
  local previous = 'closed'
  if before then previous = before.st end
  if after.st == previous then return nil end
  return {i, after.st, previous, after.rs, after.f, retry_in(after)}
end

local function release(oh, sid, gen, token)
  local c = load(oh, sid)
  if not c or c.g ~= gen or c.st ~= 'half_open' then return end
  unlease(oh, sid, c.pl, token)
end

if op == 'record' then
  local oh, ticket_seq, token = arg(), tonumber(arg()), arg()
  local probes = {}
  for i = 1, tonumber(arg()) do probes[i] = {arg(), tonumber(arg())} end
  local n = tonumber(arg())
  if n < 0 then  -- a success admitted on a healthy origin: anything to reset?
    local sick = unhealthy(oh)
    return {sick, sick, {}, seq(oh)}
  end
  local keys = {}
  for i = 1, n do
    keys[i] = {sid = arg(), seen = tonumber(arg()), kind = arg(), origin = arg(),
               credential = arg(), model = arg()}
  end
  if n > 0 then
    KIND, REASON, UNAVAILABLE = arg(), arg(), arg()
    RETRY_AFTER, SLOW = tonumber(arg()), arg() == '1'
    THRESHOLD, COOLDOWN = tonumber(arg()), tonumber(arg())
    MAX_COOLDOWN, MULTIPLIER = tonumber(arg()), tonumber(arg())
    INITIAL, MAXIMUM = tonumber(arg()), tonumber(arg())
    local threshold, window = tonumber(arg()), tonumber(arg())
    local minimum, buckets_n = tonumber(arg()), tonumber(arg())
    ROUTED = arg() == '1'  -- a routed request's verdict
    if threshold then
      RATE = {threshold = threshold, window = window, minimum = minimum, buckets = buckets_n}
      FLOOR = window * 1000
    end
  end
  local changes, done = {}, {}
  for i, key in ipairs(keys) do
    done[key.sid] = true
    local change = apply(i, key, oh, ticket_seq)
    if change then changes[#changes + 1] = change end
  end
  for _, p in ipairs(probes) do
    if not done[p[1]] then release(oh, p[1], p[2], token) end
  end
  return {2, unhealthy(oh), changes, seq(oh), DROPPED}
end

-- operators ------------------------------------------------------------------------------------
-- The scopes alive, as {origin hash, scope id}: of one origin, or (oh '') of the
-- whole store when it keeps the index (none otherwise: Redis Cluster asks origin by origin).
local function alive(oh)
  local out = {}
  if oh ~= '' then
    for _, sid in ipairs(redis.call('ZRANGE', okey(oh), int(real), '+inf', 'BYSCORE')) do
      out[#out + 1] = {oh, sid}
    end
  elseif IDX then
    for _, m in ipairs(redis.call('ZRANGE', IDX, int(real), '+inf', 'BYSCORE')) do
      local moh, sid = split(m)
      out[#out + 1] = {moh, sid}
    end
  end
  return out
end

if op == 'snapshot' then
  local out = {}
  for _, s in ipairs(alive(arg())) do
    local v = redis.call('HMGET', skey(s[1], s[2]), 'k', 'o', 'c', 'm', 'st', 'rs', 'f', 'r', 'w')
    if v[1] then
      out[#out + 1] = {s[2], v[1], v[2], v[3], v[4], v[5], v[6], tonumber(v[7]),
                       num(tonumber(v[8]) - now), v[9] or '0', s[1]}
    end
  end
  return out
end

if op == 'clear' then
  local oh, sid = arg(), arg()
  if redis.call('EXISTS', skey(oh, sid)) == 0 then return 0 end
  bump(oh)
  forget(sid, oh)
  return 1
end

-- An admission whose reply was lost (a timeout, a cancelled task): its probe
-- leases go at once, and its token is marked so that, arriving after its
-- drop, it takes nothing.
if op == 'drop' then
  local oh, token, lease, n = arg(), arg(), arg(), tonumber(arg())
  redis.call('SET', dkey(oh, token), '1', 'PX', lease)
  for _ = 1, n do
    local sid = arg()
    local pl = redis.call('HGET', skey(oh, sid), 'pl')
    if pl then unlease(oh, sid, leases(pl), token) end
  end
  return 1
end

-- What a mirror starts from: the origins with unhealthy scopes, each with its
-- sequence, and the server's clock on the sequence's scale.
if op == 'origins' then
  local seen, out = {}, {}
  for _, s in ipairs(alive(arg())) do
    if not seen[s[1]] and redis.call('EXISTS', skey(s[1], s[2])) == 1 then
      seen[s[1]] = true
      out[#out + 1] = {s[1], seq(s[1])}
    end
  end
  return {int(real * 1000), out}
end

if op == 'count' then
  return #alive(arg())
end

return redis.error_reply('sidestep: unknown operation')
"""
