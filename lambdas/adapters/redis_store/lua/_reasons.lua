-- reasons: the reason a dependent gets when its input did not succeed; the input's own
-- reason follows, cut short so that a failure passed down a long chain does not grow with it.
local function dependency_reason(input, state, why)
  if state == 'CANCELLED' then return 'cancelled: input task ' .. input .. ' was cancelled' end
  local r = 'DependencyFailed: input task ' .. input .. ' ended ' .. state
  if why and why ~= '' then r = r .. ': ' .. string.sub(why, 1, 300) end
  return r
end
