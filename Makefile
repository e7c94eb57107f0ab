# skyfn: `make demo` runs the main job on the embedded default, `make test` the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench bench-e2e bench-agent bench-warming bench-deps clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml scripts/install-system.sh
	bash scripts/install-system.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: install
	$(PY) -m examples.monte_carlo_pi

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -x tests/unit tests/service

# issue 22: the import rules (.importlinter: layers, lambdas | endpoint_agent independent, no
# circles inside any package); `make test` checks them too (tests/unit/test_import_contracts.py)
.PHONY: lint-imports
lint-imports: install
	$(VENV)/bin/lint-imports --no-cache

# Benchmarks run their peers (Parsl HTEX, Globus Compute's engine) in the same run.
bench: bench-e2e bench-agent bench-warming bench-dataflow

bench-deps: bench-requirements
	test -x $(VENV)/peers/gce/bin/python || $(PY) -m benchmarks.agent --setup-gce

# the peers installed in .venv (requirements-bench.txt: ProxyStore, Dask; Parsl comes with dev)
.PHONY: bench-requirements
bench-requirements: install
	$(PY) -m pip install -q -r requirements-bench.txt

bench-e2e: bench-deps
	$(PY) -m benchmarks.e2e --json

bench-agent: bench-deps
	$(PY) -m benchmarks.agent --json

# issue 37: the benchmark gate -- the figures users feel, each a ratio against a peer measured in
# the same run, against benchmarks/gate_limits.yaml (about 3 minutes on 2 cores); .ci/run runs it
# after `make test`. A figure past its limit fails naming the figure, value, limit and command.
.PHONY: bench-gate
bench-gate: bench-requirements
	$(PY) -m benchmarks.gate --json

# Where one round trip goes, part by part, with Parsl HTEX's in the same run (issue 13)
.PHONY: bench-rtt-floor
bench-rtt-floor: bench-deps
	$(PY) -m benchmarks.rtt_floor --json

bench-warming: install
	$(PY) -m benchmarks.warming --json

# issue 26: futures as arguments -- a 1,000-task chain and a 10,000-into-1 fan-in on the embedded
# runtime, with Parsl (DataFlowKernel over HTEX) and Dask distributed (LocalCluster) in the same
# run, and the SDK's requests while a graph runs (benchmarks/dataflow.py; a few minutes)
.PHONY: bench-dataflow
bench-dataflow: bench-requirements
	$(PY) -m benchmarks.dataflow --json

# issue 39: a fleet's worth -- the ladder N = 10, 100, 1,000 endpoints (light agents in fleet host
# processes) and M = 10, 30, 100 users on one embedded runtime, each rung on a fresh runtime:
# service CPU per task and per idle endpoint, Redis ops and bytes per idle endpoint,
# connections, probe round trips on a busy and an idle endpoint, heartbeat-to-online lag
# (benchmarks/fleet.py; ~25 minutes). FLEET_ARGS adds options, e.g. FLEET_ARGS="--rungs 10,100"
# or FLEET_ARGS="--churn --churn-minutes 3".
.PHONY: bench-fleet
FLEET_ARGS ?=
bench-fleet: install
	$(PY) -m benchmarks.fleet --json $(FLEET_ARGS)

# issue 24: sustained load, 5,000 no-op tasks/s for 10 minutes on the embedded runtime, results
# read as they come; Redis memory, outbox, retirement and a probe's round trip sampled
# (benchmarks/soak.py; ~13 minutes). Records retire result_ttl after they were read: 60 s here,
# so the last 5 minutes show the steady state. SOAK_ARGS adds options, e.g.
# `make soak SOAK_ARGS="--rate 10000"` (backpressure) or SOAK_ARGS="--kill-redis-at 300".
.PHONY: soak
SOAK_ARGS ?=
soak: install
	$(PY) benchmarks/soak.py --json --rate 5100 --minutes 10 --result-ttl 60 --batch-size 2000 $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# issue 26: Parsl's own test suite, from the installed parsl package, with every task on the
# embedded runtime through SkyfnExecutor (skyfn/parsl): the selection Parsl's CI gave its
# GlobusComputeExecutor, and the deselections beyond it listed in docs/parsl.md
# (scripts/test_parsl.sh). Its own virtualenv: Parsl's tests need pytest<8
# (requirements-parsl-suite.txt); parsl, skyfn and the rest come from .venv through a .pth file.
PARSL_VENV := $(VENV)/parsl-suite
PARSL_STAMP := $(PARSL_VENV)/.installed
.PHONY: test-parsl
$(PARSL_STAMP): requirements-parsl-suite.txt | $(STAMP)
	rm -rf $(PARSL_VENV)
	$(PYTHON) -m venv $(PARSL_VENV)
	$(PARSL_VENV)/bin/python -m pip install -q -r requirements-parsl-suite.txt
	$(PARSL_VENV)/bin/python -c "import sys, sysconfig; open(sysconfig.get_paths()['purelib'] + '/zz-skyfn-venv.pth', 'w').write('import site; site.addsitedir(%r)\n' % sys.argv[1])" \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	touch $(PARSL_STAMP)
test-parsl: install $(PARSL_STAMP)
	bash scripts/test_parsl.sh

# issue 40: direct sessions through NATs (network namespaces; needs root): tcp / punched /
# relayed paths of one agent in one run (docs/direct-from-a-laptop.md).
.PHONY: bench-direct-nat
bench-direct-nat: install
	$(PY) -m benchmarks.direct_nat --json

# issue 4: comm — communicator through real NATs (network namespaces; needs root) vs
# iperf3, a C socket ping-pong and Redis; rendezvous pairings/s; collectives on 2/4/8 ranks.
.PHONY: bench-comm
bench-comm: install
	$(PY) -m benchmarks.comm --json

# issue 4: comm — rebuild the extension comm._core (Cython binding + C++ core, built in
# place by `pip install -e .`) when its sources change; the stamp above tracks requirements.
COMM_SRC := setup.py $(wildcard comm/*.pyx comm/*.pxd comm/*.h comm/cpp/include/skyfn_comm/*.hpp comm/cpp/src/*.cpp comm/cpp/src/*.hpp)
COMM_STAMP := $(VENV)/.comm-built
install: $(COMM_STAMP)
$(COMM_STAMP): $(STAMP) $(COMM_SRC)
	@so=$$(ls comm/_core*.so 2>/dev/null | head -1); \
	if [ -z "$$so" ] || [ -n "$$(find $(COMM_SRC) -newer $$so)" ]; then \
	  echo "building comm._core"; $(PY) -m pip install -q --no-deps -e .; fi
	touch $(COMM_STAMP)

# issue 4: comm — C++ core: configure, build and run its GoogleTest suite (ctest) in
# build/comm-cpp; the transport tests start the real rendezvous server from .venv.
# Part of `make test` (about a minute), before pytest.
.PHONY: test-cpp
test: test-cpp
test-cpp: install
	cmake -S comm/cpp -B build/comm-cpp -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build/comm-cpp -j2
	ctest --test-dir build/comm-cpp --output-on-failure

# issue 6: placement — aAPP decision time at 16/64/256/1,024 workers (skyfn.placement).
.PHONY: bench-placement
bench-placement: install
	$(PY) -m benchmarks.placement --json

# issue 5: AWS (CDK, infra/aws) — its own virtualenv .venv/cdk (aws-cdk-lib's jsii pins
# typeguard 2, parsl needs 4), the CDK CLI pinned in package-lock.json (npm ci), `make synth`
# (every stack into cdk.out; the Lambda layer's wheels are fetched once into build/aws/wheels,
# offline afterwards; no Docker), cfn-lint on the templates, tests/aws, the cost model.
CDK_VENV := $(VENV)/cdk
CDK_STAMP := $(CDK_VENV)/.installed
CDK := CDK_DISABLE_CLI_TELEMETRY=true JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 node_modules/.bin/cdk
.PHONY: cdk-venv synth cdk-lint test-aws bench-cost
cdk-venv: $(CDK_STAMP)
$(CDK_STAMP): requirements-aws.txt
	$(PYTHON) -m venv $(CDK_VENV)
	$(CDK_VENV)/bin/python -m pip install -q --upgrade pip
	$(CDK_VENV)/bin/python -m pip install -q -r requirements-aws.txt
	touch $(CDK_STAMP)
node_modules/.bin/cdk: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch node_modules/.bin/cdk
synth: cdk-venv node_modules/.bin/cdk
	$(CDK) synth --no-notices --quiet $(CDK_ARGS)
cdk-lint: synth
	$(CDK_VENV)/bin/cfn-lint --non-zero-exit-code error -- cdk.out/*.template.json
# issue 25: the e2e suites against the runtime started from the synthesized templates
# (`skyfn local up --from-templates`), IAM enforced in moto; the test sessions fail on any
# AccessDenied and append what each function used to build/iam-usage.jsonl (the
# least-privilege report: python -m infra.local.standins.iam.report_cli)
TEMPLATES := build/cdk.out-local
DEPLOY_SUITES := tests/e2e/test_task_path.py tests/e2e/test_push.py tests/e2e/test_push_final_states.py \
	tests/e2e/test_large_data.py tests/e2e/test_memo.py tests/e2e/test_data.py tests/e2e/test_flows_ap.py \
	tests/e2e/test_result_retention.py tests/e2e/test_dataflow.py tests/e2e/test_dataflow_release_iam.py tests/runs
# Left out: a user's own S3 store is the user's account, for which moto (one account here)
# would need the user's keys in the function
DEPLOY_DESELECT := --deselect "tests/e2e/test_data.py::test_pipeline_a_to_b_through_a_users_own_s3_or_file_store[s3]"
.PHONY: synth-local test-deploy
synth-local: cdk-venv
	CDK_DISABLE_CLI_TELEMETRY=true JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 \
		$(CDK_VENV)/bin/python -m infra.aws.synth_local $(TEMPLATES)
test-deploy: install synth-local
	rm -f build/iam-usage.jsonl
	SKYFN_TEST_CDK_OUT=$(CURDIR)/$(TEMPLATES) SKYFN_TEST_IAM_REPORT=$(CURDIR)/build/iam-usage.jsonl \
		$(PY) -m pytest -q -p no:cacheprovider $(DEPLOY_DESELECT) $(DEPLOY_SUITES)
test-aws: cdk-venv
	CDK_DISABLE_CLI_TELEMETRY=true $(CDK_VENV)/bin/python -m pytest -q tests/aws
test: cdk-venv
bench-cost: install
	$(PY) -m benchmarks.cost --json

# Step Functions batch fan-out, 100,000 tasks through the Distributed Map (H6; outside `make test`)
.PHONY: bench-fanout
bench-fanout: install
	$(PY) -m benchmarks.fanout --tasks 100000 --json

# Reliability (H8): fuzz the REST API from its OpenAPI document, >= 1,000 requests per route
.PHONY: fuzz
fuzz: install
	SKYFN_FUZZ_EXAMPLES=1000 $(PY) -m pytest -q tests/service/test_fuzz.py

# issue 4: comm — distributed hash join (comm.join) of 2 x 4.5M rows on 1/2/4 ranks vs pyarrow.
.PHONY: bench-join
bench-join: install
	$(PY) -m benchmarks.join --json

# issue 6: placement — three real endpoints on the embedded runtime: round-robin vs
# shortest-backlog stream, divide/impera/heavy with and without affinity (~3 minutes).
.PHONY: bench-placement-sites
bench-placement-sites: install
	$(PY) -m benchmarks.placement_sites --json

# Reliability (H8): 20,000 tasks from 4 SDK clients while workers, managers, the agent,
# redis-server and the service are killed at random intervals (tests/e2e/chaos.py)
.PHONY: chaos
chaos: install
	$(PY) -m tests.e2e.chaos --tasks 20000 --clients 4 --pace 200 --interval 2 8 --json

# the same with task graphs (issue 26): blocks of five tasks with edges, checked for order
.PHONY: chaos-graphs
chaos-graphs: install
	$(PY) -m tests.e2e.chaos --graphs --tasks 20000 --clients 4 --pace 200 --interval 2 8 --json

# Security (H9): authentication, sharing, endpoint credentials, limits, S3 offload, no
# secret in any log (docs/security.md, "What each security test proves").
.PHONY: test-security
test-security: install
	$(PY) -m pytest -q tests/service/test_auth.py tests/service/test_auth_agent.py tests/service/test_sharing.py \
		tests/service/test_rendezvous_tokens.py \
		tests/service/test_limits.py tests/sdk/test_login.py tests/e2e/test_security.py tests/e2e/test_large_data.py

# issue 14: packaging — `make wheels`: the sdists, the pure-Python SDK wheel (skyfn) and the
# platform wheel of the communicator (skyfn-comm, manylinux) in build/wheels, checked with twine
# and auditwheel (tools in their own virtualenv, build/venvs/tools, from requirements-build.txt).
# `make test-install` (part of `make test`, ~5 minutes): the SDK wheel alone into a fresh
# virtualenv (binaries only, no compiler), `skyfn --help`, the sys.modules rule, and a function
# run through an embedded runtime started from a fresh `skyfn[all]` install
# (scripts/check_install.py). `make bench-install`: SDK vs globus-compute-sdk install size,
# distributions and cold import time (benchmarks/install.py).
TOOLS_VENV := build/venvs/tools
TOOLS_STAMP := $(TOOLS_VENV)/.installed
.PHONY: wheels test-install bench-install
$(TOOLS_STAMP): requirements-build.txt
	$(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install -q -r requirements-build.txt
	touch $(TOOLS_STAMP)
wheels: $(TOOLS_STAMP)
	$(TOOLS_VENV)/bin/python scripts/build_wheels.py --outdir build/wheels
test-install: install wheels
	$(PY) scripts/check_install.py --wheels build/wheels --workdir build/install-check
test: test-install
bench-install: wheels
	$(PY) -m benchmarks.install --wheels build/wheels --json

# issue 12: memoization — a 10,000-task map run twice with Executor(memoize=True): the
# second run dispatches nothing (events read back) and its speed-up is printed.
.PHONY: bench-memo
bench-memo: install
	$(PY) -m benchmarks.memo --json

# issue 12: data plane — put -> resolved in another process at 1 KiB/1 MiB/100 MiB for the
# redis, file, s3 (moto) and direct connectors, with ProxyStore 1.1.0's redis and file
# connectors in the same run (ratios printed); the MapReduce word count's shuffle.
.PHONY: bench-data bench-mapreduce
bench-data: bench-deps
	$(PY) -m benchmarks.data --json
bench-mapreduce: install
	$(PY) -m benchmarks.mapreduce --json
