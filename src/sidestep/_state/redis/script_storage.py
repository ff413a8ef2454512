"""The Lua script's storage: how it keeps scopes in Redis (`scripts` says what each key holds).

Each origin's sequence; one scope's hash (its circuit, its probe leases);
the sorted sets of scopes by expiry, a scope placed in them or forgotten, an
origin's change announced to every mirror; and room made under the cap
(``max_scopes``). The second part of `scripts.SCRIPT`.
"""

from __future__ import annotations

__all__ = ["STORAGE"]

STORAGE = r"""
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
end"""
