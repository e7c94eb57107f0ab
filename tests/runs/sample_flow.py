"""A small flow for the `skyfn flow run` CLI test: n -> [0..n) -> squares -> [sum, max]."""
from skyfn.flows import Flow, Map, Parallel, Step
from tests.runs import fns

INPUT = 4

flow = Flow("sample", Step(fns.upto, "local"), Map(Step(fns.square, "local"), name="squares"),
            Parallel(Step(fns.total, "local"), Step(fns.largest, "local"), name="summary"))
