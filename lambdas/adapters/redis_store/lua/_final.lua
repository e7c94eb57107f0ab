-- final: the final states: a task in one of them is never changed again.
local FINAL = {SUCCEEDED = true, FAILED = true, TIMED_OUT = true, CANCELLED = true}
