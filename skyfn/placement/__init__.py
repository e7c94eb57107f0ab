"""The placement engine: the aAPP policy language (model, YAML loader), the live state
of workers, and the scheduler that picks a worker for a tagged function.

Pure Python (PyYAML only), so both the service (choosing an endpoint in a group) and the
endpoint agent (choosing a manager) import it without importing each other.

    from skyfn.placement import load_policy, LiveState, Scheduler
    policy = load_policy(open("policy.yaml").read(), source="policy.yaml")
    state = LiveState(); state.upsert("w1", capacity=4); state.upsert("w2", capacity=4)
    decision = Scheduler(policy, state).place("divide")   # decision.worker, decision.explain()
"""
from skyfn.placement.loader import load_policy, load_policy_file
from skyfn.placement.model import (
    DEFAULT_TAG, FOLLOWUPS, STRATEGIES, Block, Invalidate, Policy, PolicyError, Problem, TagPolicy,
)
from skyfn.placement.scheduler import BlockTrace, Decision, Scheduler
from skyfn.placement.state import LiveState, WorkerState

__all__ = ["load_policy", "load_policy_file", "Policy", "PolicyError", "Problem", "TagPolicy", "Block",
           "Invalidate", "STRATEGIES", "FOLLOWUPS", "DEFAULT_TAG", "LiveState", "WorkerState", "Scheduler",
           "Decision", "BlockTrace"]
