"""The Lua script's operations, the one ``ARGV[1]`` names running and returning its reply.

An admission (``admit``), a verdict or a release of probe slots
(``record``), and the operators' and the mirror's calls: ``snapshot``,
``clear``, ``drop`` (a lost admission's), ``origins``, ``count``. The last
part of `scripts.SCRIPT`.
"""

from __future__ import annotations

__all__ = ["OPERATIONS"]

OPERATIONS = r"""
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
                       num(tonumber(v[8])), v[9] or '0', s[1]}
    end
  end
  return {num(now), out}
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
