"""The Lua script's state machine: `circuit` transcribed, on the circuit a scope's hash holds.

A success, a failure or a suspension moves a circuit on, with the failure
rate's buckets; the parameters are the record call's (read by
`script_operations`). The third part of `scripts.SCRIPT`.
"""

from __future__ import annotations

__all__ = ["CIRCUIT"]

CIRCUIT = r"""
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
"""
