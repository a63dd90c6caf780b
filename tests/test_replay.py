"""The replay suite: every committed history (tests/histories/*.json) replays through the current
workflow code, so a change to the command sequence that an open job already took fails here,
not on a production worker. No server needed: temporalio's Replayer runs the histories offline.

Regenerate with `make histories` only for a new scenario or after a change guarded by
`workflow.patched(...)` (docs/architecture.md, "Changing workflow code safely").
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

with workflow.unsafe.imports_passed_through():
    from gpuprov.engine.worker import WORKFLOWS
    from gpuprov.models import JobStatus
    from tests.histories.record import HERE, SCENARIOS
    from workflows.intake import NO_INPUT
    from workflows.job import ProvisionJob

# <scenario>.json, written by the recorder, and <scenario>.<change-id>.json: an older recording
# kept by hand while a workflow.patched branch still has to replay it (the recorder never
# touches those; docs/architecture.md, "Changing workflow code safely").
HISTORIES = sorted(HERE.glob("*.json"))


def _scenario_of(path: Path) -> str:
    return path.name.split(".")[0]


def replayer_of(workflows: list[type]) -> Replayer:
    # debug_mode turns off the SDK's 2-second deadlock detector: a replay proves determinism,
    # and a loaded machine can take longer than 2 s over a large job's activation.
    return Replayer(workflows=workflows, data_converter=pydantic_data_converter, debug_mode=True)


def _history(path: Path) -> WorkflowHistory:
    scenario = SCENARIOS[_scenario_of(path)]
    return WorkflowHistory.from_json(scenario.workflow_id, path.read_text())


@pytest.mark.parametrize("path", HISTORIES, ids=[p.name.removesuffix(".json") for p in HISTORIES])
async def test_history_replays_on_the_current_code(path: Path):
    assert _scenario_of(path) in SCENARIOS, f"{path.name}: no such scenario in record.py"
    replayer = replayer_of(WORKFLOWS)
    await replayer.replay_workflow(_history(path))


def test_every_scenario_has_its_history_and_every_history_a_scenario():
    recorded = {path.name.removesuffix(".json") for path in HISTORIES}
    missing = sorted(set(SCENARIOS) - recorded)
    assert missing == [], f"run `make histories ONLY='{' '.join(missing)}'`"
    strays = sorted(name for name in recorded if name.split(".")[0] not in SCENARIOS)
    assert strays == [], "histories of no scenario in tests/histories/record.py"


def test_histories_are_of_the_workflow_type_their_scenario_says():
    for name, scenario in SCENARIOS.items():
        started = _history(scenario.path).events[0].workflow_execution_started_event_attributes
        assert started.workflow_type.name == scenario.workflow, name


# ---------------------------------------------------------------- the suite can fail


@workflow.defn(name="ProvisionJob")
class ProvisionJobWithAnExtraTimer(ProvisionJob):
    """ProvisionJob with one command added at the start of a run: a 1-second timer."""

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> JobStatus:
        await workflow.sleep(1)
        return await super().run(raw)


@workflow.defn(name="ProvisionJob")
class ProvisionJobWithAPatchedTimer(ProvisionJob):
    """The same change behind `workflow.patched`: old histories take the old branch."""

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> JobStatus:
        if workflow.patched("replay-suite-extra-timer"):
            await workflow.sleep(1)
        return await super().run(raw)


async def test_a_changed_command_sequence_fails_replay():
    replayer = replayer_of([ProvisionJobWithAnExtraTimer])
    result = await replayer.replay_workflow(
        _history(SCENARIOS["happy_path"].path), raise_on_replay_failure=False
    )
    assert isinstance(result.replay_failure, workflow.NondeterminismError), result.replay_failure
    assert "TMPRL1100" in str(result.replay_failure)


async def test_the_same_change_behind_workflow_patched_replays():
    replayer = replayer_of([ProvisionJobWithAPatchedTimer])
    await replayer.replay_workflow(_history(SCENARIOS["happy_path"].path))
